"""Data-parallel replicas on several hosts, run as hosts run them: the head is `LLM` in this
process with one replica of its own, the other "host" is `vjx serve --headless` with the next
replica, dialling the head over tcp. The replicas give the tokens of a single-process engine;
the head's shutdown ends the other host cleanly; killing the other host ends the head's
engine with EngineDeadError within 10 s."""

import signal
import time

import pytest

from tests.helpers import multi_host, worker_rpc
from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx import LLM, SamplingParams
from vjx.distributed.channel import free_ports
from vjx.engine.exceptions import EngineDeadError
from vjx.engine_args import EngineArgs

# Its processes watch each other with 5-second heartbeats: under the parallel part of
# `make test` (three processes on two cores) a busy rank can miss them, so it runs alone.
pytestmark = pytest.mark.serial

_GREEDY = SamplingParams(max_tokens=multi_host.MAX_TOKENS, temperature=0.0)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return save_tiny_default_model(tmp_path_factory.mktemp("tiny"))


def _head(model: str, port: int) -> LLM:
    return LLM(
        model,
        data_parallel_size=2,
        data_parallel_size_local=1,
        data_parallel_address="127.0.0.1",
        data_parallel_rpc_port=port,
        seed=0,
        **multi_host.ENGINE_ARGS,
    )


def _token_ids(llm: LLM) -> list[list[int]]:
    outputs = llm.generate(multi_host.PROMPTS, _GREEDY, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


@pytest.fixture(scope="module")
def single_process_tokens(model) -> list[list[int]]:
    llm = LLM(model, seed=0, **multi_host.ENGINE_ARGS)
    try:
        return _token_ids(llm)
    finally:
        llm.shutdown()


def test_a_replica_on_another_host_gives_single_process_tokens(model, single_process_tokens):
    port = free_ports()
    other_host = multi_host.start_headless_replicas(model, port, data_parallel_size=2, start_rank=1, local=1)
    try:
        llm = _head(model, port)
        try:
            assert _token_ids(llm) == single_process_tokens
            # Two replicas, each its own process: the least-loaded rule sent requests to both.
            assert len(set(llm.collective_rpc(worker_rpc.process_id))) == 2
            assert llm.llm_engine.engine_core.balancer.num_unfinished == [0, 0]
        finally:
            llm.shutdown()
        # The head's shutdown tells the other host's replica to end; its host then returns 0.
        assert other_host.wait(30) == 0, other_host.stderr.read()[-2000:]
    finally:
        multi_host.stop(other_host)


def test_killing_the_other_host_ends_the_engine_within_ten_seconds(model):
    port = free_ports()
    other_host = multi_host.start_headless_replicas(model, port, data_parallel_size=2, start_rank=1, local=1)
    llm = None
    try:
        llm = _head(model, port)
        assert len(_token_ids(llm)) == len(multi_host.PROMPTS)
        other_host.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(EngineDeadError, match="replica 1 on another host stopped answering"):
            while True:
                _token_ids(llm)
        assert time.monotonic() - killed < 10.0
    finally:
        if llm is not None:
            llm.shutdown()
        multi_host.stop(other_host)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(data_parallel_size=2, data_parallel_start_rank=2), r"data_parallel_start_rank must be in \[0, 1\]"),
        (dict(data_parallel_size=2, data_parallel_size_local=3), r"data_parallel_size_local must be in \[1, 2\]"),
        (
            dict(data_parallel_size=3, data_parallel_start_rank=1, data_parallel_size_local=3),
            r"data_parallel_size_local must be in \[1, 2\]",
        ),
        (dict(data_parallel_size=2, data_parallel_rpc_port=65535), r"data_parallel_rpc_port must be in \[1, 65533\]"),
        (dict(data_parallel_size=2, data_parallel_size_local=1, multiprocess=False), "reached from engine processes"),
    ],
)
def test_bad_data_parallel_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**kwargs).create_parallel_config()


def test_headless_without_a_start_rank_or_node_rank_is_refused():
    from serving.cli import main

    assert main(["serve", "--headless", "-dp", "2", "-dpl", "1"]) == 2
