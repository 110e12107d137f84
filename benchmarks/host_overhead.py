r"""Host overhead: where the engine's host (Python) time per step goes, phase by phase.

A batch of `--batch-size` random prompts of `--input-len` tokens, each generating exactly
`--output-len` tokens (ignore_eos, temperature 1), runs once untimed and once timed on one
in-process engine; the timed run's host time is split into exclusive phases per step:

- schedule:  `Scheduler.schedule`
- update_states, order_rows, prepare_inputs, prepare_sampling, features: the model runner's
  host work for one step (`prepare_inputs` excludes `prepare_sampling`, which it calls)
- device_put: the one host-to-device transfer of the packed buffer
- step_call:  calling the AOT-compiled step (dispatch; on a GPU XLA launches the kernels here,
  so it includes launch time but not the device's run time, unless the step must wait)
- execute_other: the rest of `execute_model` (glue between the phases above)
- collect:   `_collect` after the step's tokens are on the host (appending tokens, outputs)
- update:    `Scheduler.update_from_output` (token append, stop checks, EngineCoreOutputs)
- gc:        Python's garbage collector anywhere in the run (taken out of the phase whose
  allocation set it off)
- device_wait: waiting for the step's sampled tokens (device time not hidden by the host;
  not host work, so not in `host`)
- front_end: the output processor (detokenize, RequestOutputs); in a separate process when
  the engine core runs multiprocess, so not in `host` either

`host` is the sum of schedule .. gc. Means are per executed step (steps that ran tokens).

CPU, a tiny random Llama (build it once; see tests/helpers/tiny_llama.py):

    python -c "from tests.helpers.tiny_llama import save_tiny_llama; \
        save_tiny_llama('/tmp/tiny-llama', 2, max_position_embeddings=4096)"
    python -m benchmarks.host_overhead --model /tmp/tiny-llama --max-model-len 2048 \
        --max-num-seqs 256 --batch-size 8 64 256 [--async-scheduling] --clock thread \
        --output-json host.json

(`--clock thread` counts the engine thread's CPU time: steadier on a shared CPU box.)

H200 (Llama-3.1-8B shapes, random weights):

    PYTHONPATH=. python3 -m benchmarks.host_overhead --model benchmarks/configs/llama-3.1-8b \
        --tokenizer .carry/smollm2 --load-format dummy --dtype bfloat16 --max-model-len 2048 \
        --batch-size 1 8 64 256 --output-json host_overhead.json
"""

import argparse
import collections
import functools
import gc
import sys
import time
from collections.abc import Callable

import numpy as np

from benchmarks import harness
from vjx import EngineArgs, SamplingParams

RUNNER_PHASES = {
    "_update_states": "update_states",
    "_order_rows": "order_rows",
    "_prepare_inputs": "prepare_inputs",
    "_prepare_sampling": "prepare_sampling",
    "_features": "features",
    "_to_device": "device_put",
}
HOST_PHASES = (
    "schedule",
    "update_states",
    "order_rows",
    "prepare_inputs",
    "prepare_sampling",
    "features",
    "device_put",
    "step_call",
    "execute_other",
    "collect",
    "update",
    "gc",
)
OTHER_PHASES = ("device_wait", "front_end")
HEADER = ["batch", "steps", *HOST_PHASES, "host", "device_wait", "front_end", "wall"]
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


class PhaseClock:
    """Exclusive time per phase: a wrapped call's time minus that of wrapped calls inside it.

    `clock` is wall time (`perf_counter`) or this thread's CPU time (`thread_time`): the
    second counts host work only, so it stays steady on a busy machine (but leaves out time
    spent waiting, e.g. for the device, and work the call hands to other threads).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.num_steps = 0
        self._child_seconds: list[float] = []
        self._start = time.perf_counter()

    def wrap(self, phase: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = self.clock()
            self._child_seconds.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = self.clock() - start
                self.seconds[phase] += elapsed - self._child_seconds.pop()
                if self._child_seconds:
                    self._child_seconds[-1] += elapsed

        return timed

    def on_gc(self, event: str, info: dict) -> None:
        """A `gc.callbacks` hook: collections count as their own phase."""
        if event == "start":
            self._gc_start = self.clock()
            return
        elapsed = self.clock() - self._gc_start
        self.seconds["gc"] += elapsed
        if self._child_seconds:
            self._child_seconds[-1] += elapsed

    def means_ms(self) -> dict[str, float]:
        steps = max(self.num_steps, 1)
        means = {phase: self.seconds[phase] / steps * 1e3 for phase in (*HOST_PHASES, *OTHER_PHASES)}
        means["host"] = sum(means[phase] for phase in HOST_PHASES)
        means["wall"] = (time.perf_counter() - self._start) / steps * 1e3
        return means


def instrument(llm, clock: PhaseClock) -> None:
    """Wraps the engine's step phases in `clock` (instance attributes shadow the methods)."""
    core = llm.llm_engine.engine_core.engine_core
    scheduler, executor = core.scheduler, core.model_executor
    runner = executor.worker.model_runner
    scheduler.schedule = clock.wrap("schedule", scheduler.schedule)
    scheduler.update_from_output = clock.wrap("update", scheduler.update_from_output)
    executor.execute_model = clock.wrap("execute_other", executor.execute_model)
    for method, phase in RUNNER_PHASES.items():
        if hasattr(runner, method):
            setattr(runner, method, clock.wrap(phase, getattr(runner, method)))

    def counted(step):
        def call(*args):
            clock.num_steps += 1
            return step(*args)

        return clock.wrap("step_call", call)

    runner._compiled = {variant: counted(step) for variant, step in runner._compiled.items()}
    collect = clock.wrap("collect", runner._collect)
    wait = clock.wrap("device_wait", lambda sampled: sampled.block_until_ready())

    def wait_then_collect(record, sampled, *outputs):
        wait(sampled)
        return collect(record, sampled, *outputs)

    runner._collect = wait_then_collect
    processor = llm.llm_engine.output_processor
    processor.process_outputs = clock.wrap("front_end", processor.process_outputs)
    gc.callbacks.append(clock.on_gc)


def run_batch(llm, clock: PhaseClock, args: argparse.Namespace, batch_size: int, rng) -> dict:
    """One untimed batch, then the timed one; the phase means of the timed one."""
    vocab_size = harness.prompt_vocab_size(llm)
    params = SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=args.output_len)

    def generate():
        ids = harness.random_token_ids(rng, vocab_size, [args.input_len] * batch_size)
        llm.generate([{"prompt_token_ids": row} for row in ids], params, use_tqdm=False)

    generate()
    clock.reset()
    generate()
    return {"batch_size": batch_size, "num_steps": clock.num_steps, "host_ms_per_step": clock.means_ms()}


def table_row(run: dict) -> list[str]:
    ms = run["host_ms_per_step"]
    cells = [ms[name] for name in (*HOST_PHASES, "host", *OTHER_PHASES, "wall")]
    return [str(run["batch_size"]), str(run["num_steps"]), *(harness.fmt(value, ".3f") for value in cells)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--batch-size",
        type=int,
        nargs="+",
        default=[8, 64, 256],
        help="One or more batch sizes, run in order on one engine.",
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time; thread: the engine thread's CPU time (steadier on a "
        "shared machine, but blind to waiting and to other threads' work).",
    )
    parser.add_argument("--output-json", default=None)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    for name in ("input_len", "output_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}.")
    harness.check_batch_sizes(args.batch_size, args.max_num_seqs)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    llm, result = harness.start_engine_run(args, "host_overhead")
    config = llm.llm_engine.config
    result.update(
        {
            "input_len": args.input_len,
            "output_len": args.output_len,
            "clock": args.clock,
            "async_scheduling": config.scheduler_config.async_scheduling,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_model_len": config.scheduler_config.max_model_len,
            "runs": [],
        }
    )
    clock = PhaseClock(CLOCKS[args.clock])
    instrument(llm, clock)
    rng = np.random.default_rng(args.seed)
    print(
        f"host overhead: {result['device']}, {config.model_config.model}, async_scheduling="
        f"{config.scheduler_config.async_scheduling}, {args.input_len} in / {args.output_len} out; "
        f"{args.clock} ms per step",
        flush=True,
    )
    harness.print_header(HEADER)
    for batch_size in args.batch_size:
        run = run_batch(llm, clock, args, batch_size, rng)
        result["runs"].append(run)
        harness.print_row(table_row(run))
        harness.write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
