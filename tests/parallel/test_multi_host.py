"""An engine over several processes joined by `jax.distributed` (the "mp" executor), run as
hosts run it: rank 0 is `LLM`, the others `vjx serve --headless`, each process with its own
CPU devices, collectives over gloo. Tensor parallelism across processes gives the tokens of
one process driving as many devices; a rank's death ends the engine with EngineDeadError."""

import json
import signal
import time

import pytest

from tests.helpers import multi_host
from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx.distributed.channel import free_ports
from vjx.engine_args import EngineArgs

# Its processes watch each other with 5-second heartbeats: under the parallel part of
# `make test` (three processes on two cores) a busy rank can miss them, so it runs alone.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return save_tiny_default_model(tmp_path_factory.mktemp("tiny"))


def _tokens(model: str, nnodes: int, tp: int) -> list[list[int]]:
    """Greedy tokens of an engine over `nnodes` processes of tp // nnodes devices each."""
    port, devices = free_ports(), tp // nnodes
    ranks = [multi_host.start_headless(rank, nnodes, port, devices) for rank in range(1, nnodes)]
    rank0 = multi_host.start_rank0(model, nnodes, tp, port, "tokens", devices)
    try:
        assert multi_host.read_line(rank0) == "ready"
        tokens = json.loads(multi_host.read_line(rank0))
        assert rank0.wait(60) == 0
        for rank in ranks:
            # Rank 0's shutdown ends the others cleanly.
            assert rank.wait(30) == 0, rank.stderr.read()[-2000:]
        return tokens
    finally:
        multi_host.stop(rank0, *ranks)


@pytest.fixture(scope="module")
def single_process_tokens(model) -> list[list[int]]:
    return _tokens(model, nnodes=1, tp=4)


def test_four_processes_give_single_process_tokens(model, single_process_tokens):
    tokens = _tokens(model, nnodes=4, tp=4)
    assert [len(t) for t in tokens] == [multi_host.MAX_TOKENS] * len(multi_host.PROMPTS)
    assert tokens == single_process_tokens


def test_ray_executor_gives_single_process_tokens(model, single_process_tokens, monkeypatch):
    """Rank 0 starts rank 1 as an actor of a local Ray cluster (this test's), each rank with
    two CPU devices."""
    import ray  # the [ray] extra, which `make test` installs

    # Tests never reach the network: no usage report.
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    rank0 = multi_host.start_rank0(model, 2, 4, free_ports(), "tokens", devices=2, backend="ray")
    try:
        assert multi_host.read_line(rank0) == "ready"
        assert json.loads(multi_host.read_line(rank0)) == single_process_tokens
        assert rank0.wait(60) == 0
    finally:
        multi_host.stop(rank0)
        ray.shutdown()


def test_two_processes_give_single_process_tokens_until_one_is_killed(model, single_process_tokens):
    """Two processes of two devices each give the tokens; then, while rank 0 generates,
    rank 1 is killed: rank 0's engine ends with EngineDeadError within 10 s."""
    port = free_ports()
    rank1 = multi_host.start_headless(1, 2, port, devices=2)
    rank0 = multi_host.start_rank0(model, 2, 4, port, "kill", devices=2)
    try:
        assert multi_host.read_line(rank0) == "ready"
        assert json.loads(multi_host.read_line(rank0)) == single_process_tokens
        time.sleep(1.0)
        assert rank0.poll() is None
        rank1.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        line = multi_host.read_line(rank0, timeout_s=30)
        elapsed = time.monotonic() - killed
        assert line.startswith("dead: "), line
        assert elapsed < 10.0, f"EngineDeadError came {elapsed:.1f} s after the kill"
        assert rank0.wait(30) == 0
    finally:
        multi_host.stop(rank0, rank1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(nnodes=0), "nnodes must be >= 1"),
        (dict(nnodes=2, node_rank=2), r"node_rank must be in \[0, 1\]"),
        (dict(nnodes=2, master_port=65535), r"master_port must be in \[1, 65533\]"),
        (dict(nnodes=2, distributed_executor_backend="uni"), "needs 'mp'"),
        (dict(nnodes=2, data_parallel_size=2), "for replicas on several hosts leave nnodes at 1"),
        (dict(nnodes=2, multiprocess=False), "runs in its own process"),
    ],
)
def test_bad_multi_node_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**kwargs).create_parallel_config()


def test_rank_above_zero_is_told_to_run_headless(model):
    with pytest.raises(ValueError, match="vjx serve --headless --nnodes 2 --node-rank 1"):
        EngineArgs(model, nnodes=2, node_rank=1).create_engine_config()


def test_headless_rank_zero_is_refused():
    from serving.cli import main

    assert main(["serve", "--headless", "--nnodes", "2", "--node-rank", "0"]) == 2


def test_multi_node_flags_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("VJX_NNODES", "3")
    monkeypatch.setenv("VJX_NODE_RANK", "2")
    monkeypatch.setenv("VJX_MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("VJX_MASTER_PORT", "40000")
    config = EngineArgs().create_parallel_config()
    assert (config.nnodes, config.node_rank, config.master_addr, config.master_port) == (3, 2, "10.0.0.7", 40000)
    # A flag given on the command line wins over the environment.
    assert EngineArgs(nnodes=2, node_rank=1).create_parallel_config().nnodes == 2
