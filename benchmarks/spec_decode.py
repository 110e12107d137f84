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
HEADER = ["workload", "batch", "method", "async", "output tok/s", "speed-up", "acceptance length", "acceptance rate"]


def _prompts(llm: LLM, workload: str, batch_size: int, input_len: int, rng: np.random.Generator) -> list:
    if workload == "repetitive":
        message = f"Repeat the following text exactly, three times:\n\n{_PASSAGE}"
        text = llm.get_tokenizer().apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
        return [text] * batch_size
    ids = harness.random_token_ids(rng, harness.prompt_vocab_size(llm), [input_len] * batch_size)
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
        max_num_seqs=max(args.num_prompts),
        max_num_batched_tokens=args.max_num_batched_tokens,
        speculative_config=_speculative_config(args, method),
        async_scheduling=_ASYNC_SCHEDULING[args.async_scheduling],
        seed=0,
    )


def _timed_runs(llm: LLM, prompts: list, args: argparse.Namespace) -> dict:
    """`--num-iters` timed runs of `prompts` (the same each time: greedy outputs repeat); the
    median run's time and rate, the range of rates, and the proposer's counts over all runs."""
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    llm.llm_engine.engine_core.make_stats()
    seconds = []
    for _ in range(args.num_iters):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
    spec = llm.llm_engine.engine_core.make_stats().spec_decoding_stats
    num_tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    median = harness.lower_median(seconds)
    return {
        "seconds": median,
        "runs_s": seconds,
        "output_tokens": num_tokens,
        "output_tokens_per_s": num_tokens / median,
        "output_tokens_per_s_min": num_tokens / max(seconds),
        "output_tokens_per_s_max": num_tokens / min(seconds),
        "num_drafts": spec.num_drafts,
        "num_draft_tokens": spec.num_draft_tokens,
        "num_accepted_tokens": spec.num_accepted_tokens,
        "mean_acceptance_length": spec.mean_acceptance_length,
        "acceptance_rate": spec.num_accepted_tokens / spec.num_draft_tokens if spec.num_draft_tokens else 0.0,
        "token_ids": [list(output.outputs[0].token_ids) for output in outputs],
    }


def run(args: argparse.Namespace, method: str) -> list[dict]:
    """One engine for `method`: a row for each workload and batch size."""
    llm = _engine(args, method)
    async_scheduling = llm.llm_engine.config.scheduler_config.async_scheduling
    rows = []
    for workload in args.workloads:
        rng = np.random.default_rng(0)
        for batch_size in args.num_prompts:
            prompts = _prompts(llm, workload, batch_size, args.input_len, rng)
            row = {"workload": workload, "batch_size": batch_size, "method": method}
            rows.append({**row, "async_scheduling": async_scheduling, **_timed_runs(llm, prompts, args)})
    llm.shutdown()
    del llm
    gc.collect()
    return rows


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
    parser.add_argument("--num-prompts", type=int, nargs="+", default=[1], help="Batch sizes (one engine each method).")
    parser.add_argument("--num-iters", type=int, default=1, help="Timed runs of each batch; the median counts.")
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


def _key(run: dict) -> tuple[str, int]:
    return run["workload"], run["batch_size"]


def _rows(runs: list[dict]) -> list[list[str]]:
    baseline = {_key(run): run["output_tokens_per_s"] for run in runs if run["method"] == "none"}
    return [
        [
            run["workload"],
            str(run["batch_size"]),
            run["method"],
            "on" if run["async_scheduling"] else "off",
            harness.fmt(run["output_tokens_per_s"], ".1f"),
            harness.fmt(run["output_tokens_per_s"] / baseline[_key(run)], ".2f", "x"),
            harness.fmt(run["mean_acceptance_length"], ".2f") if run["num_drafts"] else "-",
            harness.fmt(run["acceptance_rate"], ".1%") if run["num_drafts"] else "-",
        ]
        for run in runs
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name, value in [("num_prompts", min(args.num_prompts)), ("num_iters", args.num_iters)]:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    platform_name, device = harness.jax_device()
    methods = ["none"] + ["ngram"] * (args.async_scheduling != "on" and not args.skip_ngram)
    methods += [method for method, name in _MODEL_METHODS.items() if getattr(args, name)]
    runs = [row for method in methods for row in run(args, method)]
    plain = {_key(row): row for row in runs if row["method"] == "none"}
    for row in runs:
        if row["method"] != "none":
            # Greedy: speculation must not change a token.
            row["same_tokens_as_without"] = row["token_ids"] == plain[_key(row)]["token_ids"]
    result = harness.run_metadata("spec_decode", "vjx", platform_name, device, args.model or "default")
    result.update(args=vars(args), runs=runs)
    header = [
        "workload",
        "batch",
        "method",
        "async",
        "output tok/s",
        "speed-up",
        "acceptance length",
        "acceptance rate",
    ]
    harness.print_table(header, _rows(runs))
    harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
