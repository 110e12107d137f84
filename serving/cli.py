"""The `vjx` command: `vjx generate` (one completion from the command line), `vjx serve`
(the OpenAI-compatible server) and `vjx bench` (the benchmarks)."""

import argparse
import logging
import os
import sys
import time

from serving.config_file import load_config_file
from serving.server_args import ServerArgs
from vjx import process_setup
from vjx.engine_args import EngineArgs
from vjx.utils.argparse_utils import FlexibleArgumentParser

API_KEY_ENV = "VJX_API_KEY"


def _generate(args: argparse.Namespace) -> int:
    from vjx import LLM, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.sampling_seed)
    start = time.perf_counter()
    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    ready = time.perf_counter()
    if args.chat:
        messages = [{"role": "user", "content": args.prompt}]
        output = llm.chat(messages, params, use_tqdm=False)[0]
    else:
        output = llm.generate(args.prompt, params, use_tqdm=False)[0]
    done = time.perf_counter()
    completion = output.outputs[0]
    print(args.prompt)
    print(completion.text)
    print(
        f"[{len(completion.token_ids)} tokens in {done - ready:.2f} s; "
        f"engine ready in {ready - start:.1f} s; finish_reason={completion.finish_reason}]",
        file=sys.stderr,
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from serving.api_server import run_server

    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"model is given twice, as {args.model_tag!r} and --model {args.model!r}.")
        args.model = args.model_tag
    if args.headless:
        return _serve_headless(EngineArgs.from_cli_args(args))
    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    server_args = ServerArgs.from_cli_args(args)
    run_server(EngineArgs.from_cli_args(args), server_args)
    return 0


def _serve_headless(engine_args: EngineArgs) -> int:
    """No server: this host's data-parallel replicas of a head's engine, or a rank > 0 of an
    engine over several hosts (its share of the devices)."""
    parallel_config = engine_args.create_parallel_config()
    if parallel_config.data_parallel_start_rank > 0:
        from vjx.engine.remote_engines import run_headless_replicas

        return run_headless_replicas(engine_args)
    if parallel_config.node_rank == 0:
        raise ValueError(
            "--headless is for the hosts after the head: --data-parallel-start-rank 1 and up (replicas of "
            "their own), or --node-rank 1 and up (a share of one engine's devices); the head serves."
        )
    from vjx.executor.multiproc_worker import run_worker

    run_worker(parallel_config)
    return 0


def _add_serve_parser(commands) -> argparse.ArgumentParser:
    serve = commands.add_parser(
        "serve",
        help="Serve the OpenAI API (completions, chat, models, metrics) over HTTP.",
        description="Serve the OpenAI-compatible API. Flags may also come from a YAML --config file; "
        "flags on the command line win. Every flag of `vllm serve`'s engine is taken, under vLLM's "
        "spellings (-tp 2, -O3, --max_model_len 2k, --compilation-config.mode 3); the ones vjx has "
        "no use for say so in their help.",
    )
    serve.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        help="Model directory or Hugging Face Hub id (same as --model); the embedded SmolLM2-135M-Instruct "
        "when left out.",
    )
    serve.add_argument("--config", default=None, help="YAML file of flags, e.g. 'max-model-len: 2048'.")
    serve.add_argument(
        "--headless",
        action="store_true",
        help="Serve no API. With --data-parallel-start-rank 1 and up: run this host's data-parallel "
        "replicas (--data-parallel-size-local of them) for the head at --data-parallel-address, under the "
        "same engine flags as the head's. With --node-rank 1 and up: run this host's share of an engine "
        "over several hosts; rank 0's config (model, lengths, parallelism) applies, only the "
        "--nnodes/--node-rank/--master-* flags are read here.",
    )
    ServerArgs.add_cli_args(serve)
    EngineArgs.add_cli_args(serve)
    serve.set_defaults(handler=_serve)
    return serve


def _bench(argv: list[str]) -> int:
    from benchmarks.cli import main as bench_main

    return bench_main(argv)


def _make_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The `vjx` parser, and its `serve` subparser (which a --config file fills in)."""
    parser = FlexibleArgumentParser(prog="vjx", description="vLLM's v1 engine on JAX/XLA.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="Complete one prompt and print the text.")
    generate.add_argument("--prompt", required=True, help="The prompt text.")
    generate.add_argument("--max-tokens", type=int, default=64, help="Most tokens to generate.")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 means greedy.")
    generate.add_argument("--sampling-seed", type=int, default=None, help="Seed of this request's sampling.")
    generate.add_argument("--chat", action="store_true", help="Wrap the prompt in the model's chat template.")
    generate.add_argument("-v", "--verbose", action="store_true", help="Log engine progress.")
    EngineArgs.add_cli_args(generate)
    generate.set_defaults(handler=_generate)
    serve = _add_serve_parser(commands)
    commands.add_parser(
        "bench", help="Benchmarks: vjx bench {latency,throughput,serve} ... (see vjx bench --help).", add_help=False
    )
    return parser, serve


def _parse_args(argv: list[str]) -> argparse.Namespace:
    """Parses `argv`; for `serve`, the --config file's flags become the defaults first."""
    parser, serve = _make_parser()
    if argv[:1] == ["serve"]:
        config_parser = argparse.ArgumentParser(add_help=False)
        config_parser.add_argument("--config", default=None)
        config_path = config_parser.parse_known_args(argv[1:])[0].config
        if config_path is not None:
            serve.set_defaults(**load_config_file(config_path, serve))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The process is the command's: set up before anything starts JAX's backends.
    process_setup.setup_process()
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    try:
        args = _parse_args(argv)
    except ValueError as e:
        print(f"vjx: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING)
    try:
        return args.handler(args)
    except ValueError as e:
        print(f"vjx: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
