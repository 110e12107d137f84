"""Runs one side of the parity checks and writes what it saw as JSON.

    python driver.py --module vllm|vjx --model DIR --part main|<own-engine example> --out FILE

The same code runs against both engines (only the module differs); run.py launches it with
vLLM's venv for `vllm` and the project's venv for `vjx`, one process at a time.
"""

import argparse
import gc
import importlib
import json
import time
import traceback

import cases

import examples

GREEDY_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite book is",
    "In 1969, the first man on the moon",
    "The quick brown fox",
    "Machine learning is a field of",
    "To make a cup of tea, you",
    "The largest planet in our solar system",
    "Dear hiring manager,",
    "import numpy as np\n",
    "The meaning of life is",
    "Paris, London and Berlin are",
    "Q: What is 2 + 2?\nA:",
]
NUM_GREEDY_TOKENS = 64
NUM_TOP_LOGPROBS = 5
ENGINE_KWARGS = {
    "dtype": "float32",
    "enable_prefix_caching": False,
    "max_model_len": 512,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 512,
    "seed": 0,
}
SIDE_KWARGS = {
    # vLLM on CPU: no torch.compile (minutes of compile on 2 cores for nothing here).
    "vllm": {"enforce_eager": True},
    # vjx sizes its KV pool from free memory; a fixed small pool keeps the machine shared.
    "vjx": {"num_gpu_blocks_override": 512},
}


def engine_kwargs(module_name: str) -> dict:
    return {**ENGINE_KWARGS, **SIDE_KWARGS[module_name]}


def greedy(m, llm) -> list[dict]:
    """Checks (a) and (b): greedy ids and, per position, the top-5 (token id, logprob) by rank."""
    sp = m.SamplingParams(temperature=0.0, max_tokens=NUM_GREEDY_TOKENS, ignore_eos=True, logprobs=NUM_TOP_LOGPROBS)
    results = []
    for out in llm.generate(GREEDY_PROMPTS, sp, use_tqdm=False):
        completion = out.outputs[0]
        top = []
        for position in completion.logprobs:
            ranked = sorted(
                (lp.rank, token, lp.logprob) for token, lp in position.items() if lp.rank <= NUM_TOP_LOGPROBS
            )
            top.append([[token, logprob] for _, token, logprob in ranked])
        results.append({"token_ids": list(completion.token_ids), "top": top})
    return results


def error_record(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "is_value_error": isinstance(exc, ValueError), "message": str(exc)[:300]}


def sampling_params_case(m, llm, kwargs: dict) -> dict:
    """Check (c) for one case: where (if anywhere) the params are rejected. A rejection that
    leaves the request behind in the engine (a failed step, not a refused request) is
    recorded as `engine_broken`: the caller then builds a fresh engine."""
    try:
        sp = m.SamplingParams(**{**cases.BASE, **kwargs})
    except Exception as exc:
        return {"rejected_at": "construct", "error": error_record(exc), "engine_broken": False}
    try:
        llm.generate([{"prompt_token_ids": [504]}], sp, use_tqdm=False)
    except Exception as exc:
        broken = llm.llm_engine.has_unfinished_requests()
        return {"rejected_at": "generate", "error": error_record(exc), "engine_broken": broken}
    return {"rejected_at": None, "error": None, "engine_broken": False}


def sampling_params_table(m, module_name: str, model: str, start: int) -> dict:
    """Check (c) from case `start` on. A case that breaks the engine ends the run (a second
    engine in one process is not something vLLM supports): `resume_at` says where the next
    process goes on."""
    llm = m.LLM(model=model, **engine_kwargs(module_name))
    results = {}
    for index in range(start, len(cases.CASES)):
        name, kwargs = cases.CASES[index]
        results[name] = sampling_params_case(m, llm, kwargs)
        if results[name]["engine_broken"]:
            return {"cases": results, "resume_at": index + 1}
    close(llm)
    return {"cases": results, "resume_at": None}


def close(llm) -> None:
    if hasattr(llm, "shutdown"):
        llm.shutdown()
    del llm
    gc.collect()


def run_example(fn, *args) -> dict:
    start = time.perf_counter()
    try:
        result = {"ok": True, "shape": fn(*args)}
    except (Exception, SystemExit) as exc:  # argparse exits on an unknown flag
        result = {"ok": False, "error": error_record(exc), "traceback": traceback.format_exc()[-1500:]}
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def run_main(m, module_name: str, model: str) -> dict:
    timings = {}
    start = time.perf_counter()
    llm = m.LLM(model=model, **engine_kwargs(module_name))
    timings["load"] = time.perf_counter() - start
    start = time.perf_counter()
    report = {"greedy": greedy(m, llm)}
    timings["greedy"] = time.perf_counter() - start
    start = time.perf_counter()
    report["examples"] = {fn.__name__: run_example(fn, m, llm, model) for fn in examples.SHARED}
    timings["examples"] = time.perf_counter() - start
    report["timings"] = {k: round(v, 1) for k, v in timings.items()}
    close(llm)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--module", choices=["vllm", "vjx"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--part", default="main", help="main, cases, or an example that builds its own engine")
    parser.add_argument("--start-case", type=int, default=0, help="with --part cases: the first case to run")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    m = importlib.import_module(args.module)
    if args.part == "main":
        report = run_main(m, args.module, args.model)
    elif args.part == "cases":
        report = sampling_params_table(m, args.module, args.model, args.start_case)
    else:
        fn = {fn.__name__: fn for fn in examples.OWN_ENGINE}[args.part]
        report = {"examples": {fn.__name__: run_example(fn, m, args.model, engine_kwargs(args.module))}}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
