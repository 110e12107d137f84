"""`LLM`'s utility methods with the engine core in its own process: every call crosses the
socket as a UTILITY message, and `collective_rpc`'s callables are pickled. The engine runs
the tiny stand-in for the default model (same tokenizer, vocabulary and architecture, two
small layers): the methods act on the engine, not on the model's numbers."""

import os

import pytest

from tests.helpers.large_engine import PROMPTS
from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from tests.helpers.worker_rpc import model_class_name, worker_summary
from vjx import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    engine = LLM(model=model, **TINY_DEFAULT_ARGS, multiprocess=True)
    yield engine
    engine.shutdown()


def _tokens(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False)]


def test_collective_rpc_by_name_and_by_function(llm):
    num_blocks = TINY_DEFAULT_ARGS["num_gpu_blocks_override"]
    assert llm.collective_rpc("get_kv_block_bytes")[0] > 0
    assert llm.collective_rpc(worker_summary, args=("a",), kwargs={"scale": 3}) == [("a", 3 * num_blocks)]
    assert llm.apply_model(model_class_name) == ["LlamaForCausalLM"]


def test_collective_rpc_errors_come_back_and_the_engine_serves_on(llm):
    with pytest.raises(RuntimeError, match="AttributeError"):
        llm.collective_rpc("no_such_method")
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="install cloudpickle"):
            llm.collective_rpc(lambda worker: 1)
    else:
        assert llm.collective_rpc(lambda worker: 1) == [1]
    assert llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_and_wake_up_give_the_same_tokens(llm, level):
    reference = _tokens(llm)
    llm.sleep(level=level)
    assert llm.is_sleeping()
    assert llm.collective_rpc(_holds_kv_cache) == [False]
    with pytest.raises(RuntimeError, match="asleep"):
        llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)
    assert llm.wake_up() is True
    assert not llm.is_sleeping()
    assert _tokens(llm) == reference


def test_bad_sleep_level_is_a_value_error(llm):
    with pytest.raises(ValueError, match="level must be one of"):
        llm.sleep(level=5)
    assert not llm.is_sleeping()


def test_profile_is_written_by_the_engine_process(llm, tmp_path):
    llm.start_profile(profile_dir=str(tmp_path))
    llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)
    llm.stop_profile()
    files = [f for _, _, names in os.walk(tmp_path) for f in names]
    assert any(f.endswith(".xplane.pb") for f in files), files


def test_reset_prefix_cache(llm):
    assert llm.reset_prefix_cache() is True


def _holds_kv_cache(worker) -> bool:
    return worker.model_runner.kv_caches is not None
