"""Speculative decoding: output tokens/s and acceptance length, with and without drafts.

For each workload, an engine without speculation and one per proposer (the n-gram proposer,
and with `--draft-model`, `--eagle-head` or `--eagle3-head` a draft model or an EAGLE head;
each in turn, the same engine arguments) generate
`--output-len` tokens for `--num-prompts` requests (greedy, ignore_eos); the table gives
output tokens/s, the speed-up, and the proposer's mean acceptance length (tokens per verified
draft, the bonus token included) and draft acceptance rate from the scheduler's counts over
the timed run.

Workloads: "repetitive" asks the model to copy a passage it was given (prompt lookup's
case: most drafts come true), "random" is random prompt tokens (few n-grams recur).

    python -m benchmarks.spec_decode --num-prompts 1 --output-len 128 \\
        --num-speculative-tokens 4 --output-json benchmarks/results/spec_decode.json

The model defaults to the embedded SmolLM2-135M-Instruct (real weights and chat template).
"""

import argparse
import gc
import time

import numpy as np

from benchmarks import harness
from vjx import LLM, SamplingParams
from vjx.models.default_model import get_default_model_path

_PASSAGE = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
    "All that glitters is not gold. The early bird catches the worm. Actions speak louder than words. "
    "Practice makes perfect. Where there is a will, there is a way. Knowledge is power."
)
WORKLOADS = ("repetitive", "random")
_MODEL_METHODS = {"draft_model": "draft_model", "eagle": "eagle_head", "eagle3": "eagle3_head"}
"""Methods that take a model, and the argument naming it."""
_ASYNC_SCHEDULING = {"default": None, "on": True, "off": False}


def _prompts(llm: LLM, workload: str, args: argparse.Namespace) -> list:
    if workload == "repetitive":
        message = f"Repeat the following text exactly, three times:\n\n{_PASSAGE}"
        text = llm.get_tokenizer().apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
        return [text] * args.num_prompts
    rng = np.random.default_rng(0)
    ids = harness.random_token_ids(rng, harness.prompt_vocab_size(llm), [args.input_len] * args.num_prompts)
    return [{"prompt_token_ids": prompt} for prompt in ids]


def _speculative_config(args: argparse.Namespace, method: str) -> dict | None:
    if method == "none":
        return None
    if method in _MODEL_METHODS:
        model = getattr(args, _MODEL_METHODS[method])
        return {"method": method, "model": model, "num_speculative_tokens": args.num_speculative_tokens}
    return {
        "method": method,
        "num_speculative_tokens": args.num_speculative_tokens,
        "prompt_lookup_min": args.prompt_lookup_min,
        "prompt_lookup_max": args.prompt_lookup_max,
    }


def _engine(args: argparse.Namespace, method: str) -> LLM:
    return LLM(
        args.model or get_default_model_path(),
        tokenizer=args.tokenizer,
        load_format=args.load_format,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=max(args.num_prompts, 1),
        max_num_batched_tokens=args.max_num_batched_tokens,
        speculative_config=_speculative_config(args, method),
        async_scheduling=_ASYNC_SCHEDULING[args.async_scheduling],
        seed=0,
    )


def run(args: argparse.Namespace, workload: str, method: str) -> dict:
    llm = _engine(args, method)
    prompts = _prompts(llm, workload, args)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    llm.llm_engine.engine_core.make_stats()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    spec = llm.llm_engine.engine_core.make_stats().spec_decoding_stats
    num_tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    async_scheduling = llm.llm_engine.config.scheduler_config.async_scheduling
    del llm
    gc.collect()
    return {
        "workload": workload,
        "method": method,
        "async_scheduling": async_scheduling,
        "seconds": elapsed,
        "output_tokens": num_tokens,
        "output_tokens_per_s": num_tokens / elapsed,
        "num_drafts": spec.num_drafts,
        "num_draft_tokens": spec.num_draft_tokens,
        "num_accepted_tokens": spec.num_accepted_tokens,
        "mean_acceptance_length": spec.mean_acceptance_length,
        "acceptance_rate": spec.num_accepted_tokens / spec.num_draft_tokens if spec.num_draft_tokens else 0.0,
        "token_ids": [list(output.outputs[0].token_ids) for output in outputs],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Model directory; the embedded SmolLM2-135M when left out.")
    parser.add_argument("--tokenizer", default=None, help="The model's tokenizer when left out.")
    parser.add_argument("--load-format", default="auto", help="'dummy': random weights of the model's shapes.")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument(
        "--skip-ngram", action="store_true", help="Leave the n-gram proposer out (it runs unless async is 'on')."
    )
    parser.add_argument("--num-prompts", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128, help="Random prompts' length.")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--draft-model", default=None, help="Also run this draft model (method draft_model).")
    parser.add_argument("--eagle-head", default=None, help="Also run this EAGLE-1 head (method eagle).")
    parser.add_argument("--eagle3-head", default=None, help="Also run this EAGLE-3 head (method eagle3).")
    parser.add_argument(
        "--async-scheduling",
        choices=list(_ASYNC_SCHEDULING),
        default="default",
        help="Every engine's async_scheduling (default: the engine's choice, off for n-gram); with 'on' the "
        "n-gram proposer, which needs the synchronous scheduler, is left out.",
    )
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-batched-tokens", type=int, default=256)
    parser.add_argument("--output-json", default=None)
    return parser


def _rows(runs: list[dict]) -> list[list[str]]:
    baseline = {run["workload"]: run["output_tokens_per_s"] for run in runs if run["method"] == "none"}
    return [
        [
            run["workload"],
            run["method"],
            "on" if run["async_scheduling"] else "off",
            harness.fmt(run["output_tokens_per_s"], ".1f"),
            harness.fmt(run["output_tokens_per_s"] / baseline[run["workload"]], ".2f", "x"),
            harness.fmt(run["mean_acceptance_length"], ".2f") if run["num_drafts"] else "-",
            harness.fmt(run["acceptance_rate"], ".1%") if run["num_drafts"] else "-",
        ]
        for run in runs
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    platform_name, device = harness.jax_device()
    methods = ["none"] + ["ngram"] * (args.async_scheduling != "on" and not args.skip_ngram)
    methods += [method for method, name in _MODEL_METHODS.items() if getattr(args, name)]
    runs = [run(args, workload, method) for workload in args.workloads for method in methods]
    plain = {run["workload"]: run for run in runs if run["method"] == "none"}
    for result in runs:
        if result["method"] != "none":
            # Greedy: speculation must not change a token.
            result["same_tokens_as_without"] = result["token_ids"] == plain[result["workload"]]["token_ids"]
    result = harness.run_metadata("spec_decode", "vjx", platform_name, device, args.model or "default")
    result.update(args=vars(args), runs=runs)
    header = ["workload", "method", "async", "output tok/s", "speed-up", "acceptance length", "acceptance rate"]
    harness.print_table(header, _rows(runs))
    harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
