"""An engine over several local processes, as hosts run it: rank 0 is `LLM` in a script of its
own (this module's `main`), the other ranks are `vjx serve --headless`. Each process sees its
own CPU devices (`--xla_force_host_platform_device_count`) and they talk over gloo.

`python -m tests.helpers.multi_host MODEL NNODES TP MASTER_PORT MODE BACKEND` runs rank 0
(BACKEND "mp": the other ranks are started apart; "ray": it starts them on the Ray cluster
that is running). It prints, each line behind "vjx-test ", "ready" once the engine is up,
then one JSON line of greedy token ids; then for MODE "tokens" it exits, for MODE "kill" it
generates until the engine dies and prints "dead: <error>".
"""

import json
import os
import subprocess
import sys
import time

from tests.helpers.remote_server import ROOT, _jax_cache_env

ENGINE_ARGS = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16, num_gpu_blocks_override=64)
PROMPTS = ["Hello there, my name is", "The capital of France is", "Count with me: one, two,"]
MAX_TOKENS = 12
START_TIMEOUT_S = 300
_PREFIX = "vjx-test "


def rank_env(devices_per_process: int) -> dict[str, str]:
    env = {**os.environ, **_jax_cache_env(), "PYTHONPATH": str(ROOT)}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_process}"
    return env


def start_rank0(
    model: str, nnodes: int, tp: int, port: int, mode: str, devices: int, backend: str = "mp"
) -> subprocess.Popen:
    command = [sys.executable, "-m", "tests.helpers.multi_host", model, str(nnodes), str(tp), str(port), mode, backend]
    return subprocess.Popen(
        command, cwd=ROOT, env=rank_env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def start_headless(rank: int, nnodes: int, port: int, devices: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "serving.cli", "serve", "--headless"]
    command += ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", "127.0.0.1"]
    command += ["--master-port", str(port)]
    return subprocess.Popen(
        command, cwd=ROOT, env=rank_env(devices), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def engine_flags(engine_args: dict) -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in engine_args.items()]


def start_headless_replicas(model: str, port: int, data_parallel_size: int, start_rank: int, local: int):
    """`vjx serve --headless` of a host with data-parallel replicas [start_rank, start_rank +
    local), one CPU device each, under the head's engine flags."""
    command = [sys.executable, "-m", "serving.cli", "serve", model, "--headless", "--seed=0"]
    command += engine_flags(ENGINE_ARGS) + ["-dp", str(data_parallel_size), "-dpr", str(start_rank)]
    command += ["-dpl", str(local), "-dpa", "127.0.0.1", "-dpp", str(port)]
    return subprocess.Popen(
        command, cwd=ROOT, env=rank_env(local), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def read_line(process: subprocess.Popen, timeout_s: float = START_TIMEOUT_S) -> str:
    """rank 0's next line of output that starts with "vjx-test " (gloo prints to stdout too),
    without that prefix; its stderr in the error when it ends first."""
    deadline = time.monotonic() + timeout_s
    os.set_blocking(process.stdout.fileno(), False)
    buffered = ""
    while time.monotonic() < deadline:
        chunk = process.stdout.readline()
        buffered += chunk or ""
        if buffered.endswith("\n"):
            if buffered.startswith(_PREFIX):
                return buffered[len(_PREFIX) :].strip()
            buffered = ""
            continue
        if not chunk and process.poll() is not None:
            raise RuntimeError(f"rank 0 exited ({process.returncode}):\n{process.stderr.read()[-4000:]}")
        if not chunk:
            time.sleep(0.05)
    raise TimeoutError(f"rank 0 printed nothing for {timeout_s} s")


def stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def main() -> None:
    from vjx import LLM, SamplingParams
    from vjx.engine.exceptions import EngineDeadError

    model, nnodes, tp, port, mode, backend = sys.argv[1], *map(int, sys.argv[2:5]), *sys.argv[5:7]
    llm = LLM(
        model,
        tensor_parallel_size=tp,
        nnodes=nnodes,
        master_port=port,
        distributed_executor_backend=backend,
        seed=0,
        **ENGINE_ARGS,
    )
    print(_PREFIX + "ready", flush=True)
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0), use_tqdm=False)
    print(_PREFIX + json.dumps([output.outputs[0].token_ids for output in outputs]), flush=True)
    if mode == "tokens":
        return
    params = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    try:
        while True:
            llm.generate(PROMPTS, params, use_tqdm=False)
    except EngineDeadError as e:
        print(f"{_PREFIX}dead: {e}", flush=True)


if __name__ == "__main__":
    main()
