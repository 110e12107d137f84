"""The `vjx` command: `vjx generate` (one completion from the command line)."""

import argparse
import logging
import sys
import time

from vjx.engine_args import EngineArgs


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


def _make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vjx", description="vLLM's v1 engine on JAX/XLA.")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return args.handler(args)
    except ValueError as e:
        print(f"vjx: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
