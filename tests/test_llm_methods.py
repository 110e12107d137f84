"""vLLM's `LLM` utility methods on one engine: sleep / wake_up, profiling, collective_rpc,
apply_model, reset_prefix_cache, priority, and the generate keywords vjx refuses.

One engine with priority scheduling, on the tiny stand-in for the default model (the
methods are the engine's, not the model's); each test leaves it awake.
"""

import os
import random

import numpy as np
import pytest
import transformers

from tests.helpers.large_engine import PROMPTS
from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from tests.helpers.worker_rpc import model_class_name, worker_summary
from vjx import LLM, EngineArgs, SamplingParams
from vjx.engine.llm_engine import LLMEngine
from vjx.lora.request import LoRARequest
from vjx.models import default_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
TEMPLATE_MARK = "{# read from a file #}"
"""A Jinja comment: renders as nothing."""
SEED = 1234


@pytest.fixture(scope="module")
def engine_and_draws(tmp_path_factory):
    # The model's own chat template, from a file (`LLM(chat_template=path)`), marked by a comment.
    model_template = transformers.AutoTokenizer.from_pretrained(default_model.get_default_model_path()).chat_template
    template_path = tmp_path_factory.mktemp("template") / "chat.jinja"
    template_path.write_text(model_template + TEMPLATE_MARK)
    random.seed(0)
    np.random.seed(0)
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    engine = LLM(
        model=model, **TINY_DEFAULT_ARGS, scheduling_policy="priority", seed=SEED, chat_template=str(template_path)
    )
    # The first draws of Python's and NumPy's generators after the engine started.
    yield engine, (random.random(), np.random.random())
    engine.shutdown()


@pytest.fixture(scope="module")
def llm(engine_and_draws):
    return engine_and_draws[0]


@pytest.fixture(scope="module")
def first_draws(engine_and_draws):
    return engine_and_draws[1]


@pytest.fixture(scope="module")
def reference(llm):
    return _tokens(llm)


def _tokens(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False)]


def _worker(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.worker


def test_seed_seeds_random_and_numpy_at_engine_start(first_draws):
    random.seed(SEED)
    np.random.seed(SEED)
    assert first_draws == (random.random(), np.random.random())


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_the_kv_pool_and_wake_up_gives_the_same_tokens(llm, reference, level):
    worker = _worker(llm)
    kv_caches = list(worker.model_runner.kv_caches)
    weights = list(worker.model_runner.param_leaves)
    llm.sleep(level=level)
    assert llm.is_sleeping()
    assert worker.model_runner.kv_caches is None
    assert all(kv_cache.is_deleted() for kv_cache in kv_caches)
    assert all(weight.is_deleted() for weight in weights)
    assert all(isinstance(weight, np.ndarray) for weight in worker.host_weights)
    with pytest.raises(RuntimeError, match="asleep"):
        llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)
    assert llm.wake_up() is True
    assert not llm.is_sleeping()
    assert worker.host_weights is None
    assert _tokens(llm) == reference


def test_sleep_resets_the_prefix_cache(llm):
    llm.generate(PROMPTS[5], GREEDY, use_tqdm=False)
    block_pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    assert block_pool.cached_block_hash_to_block
    llm.sleep(level=1)
    assert not block_pool.cached_block_hash_to_block
    llm.wake_up()


def test_wake_up_by_tags(llm, reference):
    engine_core = llm.llm_engine.engine_core.engine_core
    llm.sleep(level=1)
    assert llm.wake_up(tags=["weights"]) is False
    assert llm.is_sleeping() and engine_core.make_stats().sleep_level == 1
    assert llm.wake_up(tags=["kv_cache"]) is True
    assert engine_core.make_stats().sleep_level is None
    assert _tokens(llm) == reference


def test_level_zero_pauses_scheduling_only(llm, reference):
    worker = _worker(llm)
    llm.sleep(level=0)
    assert llm.is_sleeping() and worker.model_runner.kv_caches is not None
    assert llm.wake_up(tags=["scheduling"]) is True
    assert _tokens(llm) == reference


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"level": 3}, "level must be one of"),
        ({"level": 1, "mode": "wait"}, "mode must be one of"),
        ({"level": 1, "mode": "keep"}, "only at level 0"),
    ],
)
def test_bad_sleep_arguments_raise(llm, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm.sleep(**kwargs)
    assert not llm.is_sleeping()


def test_bad_wake_up_tags_raise(llm):
    with pytest.raises(ValueError, match="tags must be"):
        llm.wake_up(tags=["everything"])


def test_priority_orders_waiting_requests(llm):
    """Paused (level 0, requests kept), the requests wait in the scheduler's queue, lowest
    priority value first."""
    engine = llm.llm_engine
    llm.sleep(level=0, mode="keep")
    for request_id, priority in [("p-late", 5), ("p-first", -1), ("p-mid", 2)]:
        engine.add_request(request_id, PROMPTS[0], GREEDY, priority)
    waiting = engine.engine_core.engine_core.scheduler.waiting
    assert [r.request_id for r in waiting] == ["p-first", "p-mid", "p-late"]
    engine.abort_request(["p-late", "p-first", "p-mid"])
    assert llm.wake_up(tags=["scheduling"])


def test_generate_passes_one_priority_per_prompt(llm, monkeypatch, reference):
    seen = []
    add_request = llm.llm_engine.add_request

    def spy(request_id, prompt, params, priority=0, prompt_text=None, lora_request=None):
        seen.append(priority)
        add_request(request_id, prompt, params, priority, prompt_text, lora_request)

    monkeypatch.setattr(llm.llm_engine, "add_request", spy)
    outputs = llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False, priority=[3, 0, 2, 1])
    assert seen == [3, 0, 2, 1]
    assert [o.outputs[0].token_ids for o in outputs] == reference
    with pytest.raises(ValueError, match=r"prompts \(4\) and priority \(2\)"):
        llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False, priority=[1, 2])


@pytest.mark.parametrize(
    "kwargs",
    [{"tokenization_kwargs": {"padding": True}}, {"mm_processor_kwargs": {"a": 1}}],
)
def test_unsupported_generate_keywords_raise_value_error(llm, kwargs):
    with pytest.raises(ValueError, match=f"{next(iter(kwargs))}.* not supported by vjx"):
        llm.generate(PROMPTS[0], GREEDY, use_tqdm=False, **kwargs)
    assert not llm.llm_engine.has_unfinished_requests()


def test_tokenization_kwargs_reach_the_tokenizer(llm):
    full = llm.get_tokenizer().encode(PROMPTS[1])
    truncate = {"truncation": True, "max_length": 3}
    (output,) = llm.generate(PROMPTS[1], GREEDY, use_tqdm=False, tokenization_kwargs=truncate)
    assert output.prompt_token_ids == full[:3] and output.prompt == PROMPTS[1]
    (tokens,) = llm.generate({"prompt_token_ids": full}, GREEDY, use_tqdm=False, tokenization_kwargs=truncate)
    assert tokens.prompt_token_ids == full
    conversation = [{"role": "user", "content": PROMPTS[1]}]
    (chat,) = llm.chat(conversation, GREEDY, use_tqdm=False, tokenization_kwargs=truncate)
    assert len(chat.prompt_token_ids) == 3


def test_enqueue_then_wait_for_completion(llm, reference):
    """vLLM's recipe: pause scheduling, queue everything, resume, wait; the outputs come in the
    order the requests were added, and a later `generate` returns its own only."""
    llm.sleep(level=0, mode="keep")
    first = llm.enqueue(PROMPTS[:2], GREEDY, use_tqdm=False)
    chat_ids = llm.enqueue_chat([{"role": "user", "content": PROMPTS[2]}], GREEDY, use_tqdm=False)
    second = llm.enqueue(PROMPTS[2:4], GREEDY, use_tqdm=False)
    assert len(llm.llm_engine.engine_core.engine_core.scheduler.waiting) == 5
    with pytest.raises(RuntimeError, match="asleep"):
        llm.wait_for_completion(use_tqdm=False)
    assert llm.wake_up(tags=["scheduling"])
    outputs = llm.wait_for_completion(use_tqdm=False)
    assert [o.request_id for o in outputs] == first + chat_ids + second
    assert [o.outputs[0].token_ids for o in outputs[:2] + outputs[3:]] == reference
    assert llm.wait_for_completion(use_tqdm=False) == []
    with pytest.raises(ValueError, match="output_type must include RequestOutput"):
        llm.wait_for_completion(int)


def test_generate_also_returns_requests_enqueued_before_it(llm, reference):
    (queued,) = llm.enqueue(PROMPTS[0], GREEDY, use_tqdm=False)
    outputs = llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)
    assert outputs[0].request_id == queued
    assert [o.outputs[0].token_ids for o in outputs] == reference[:2]


def test_world_size_and_from_engine_args(llm, monkeypatch):
    assert llm.get_world_size() == llm.get_world_size(include_dp=False) == 1
    seen = {}
    monkeypatch.setattr(LLM, "__init__", lambda self, **kwargs: seen.update(kwargs))
    engine_args = EngineArgs(max_model_len=128, enforce_eager=True)
    LLM.from_engine_args(engine_args)
    assert seen == vars(engine_args)


@pytest.mark.parametrize("name", ["reset_running_requests", "reset_connector"])
def test_reset_prefix_cache_refuses_what_vjx_lacks(llm, name):
    with pytest.raises(ValueError, match=f"{name}=True is not supported by vjx"):
        llm.reset_prefix_cache(**{name: True})


def test_profile_writes_a_trace_directory(llm, tmp_path):
    llm.start_profile(profile_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="already running"):
        llm.start_profile(profile_dir=str(tmp_path))
    llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)
    llm.stop_profile()
    files = [os.path.join(d, f) for d, _, names in os.walk(tmp_path) for f in names]
    assert any(f.endswith(".xplane.pb") for f in files), files


def test_profile_prefix_and_environment_variable(llm, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_TORCH_PROFILER_DIR", str(tmp_path))
    llm.start_profile("run-1")
    llm.stop_profile()
    assert os.listdir(tmp_path / "run-1")


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("bad prefix!",), {"profile_dir": "/tmp"}, ValueError, "profile_prefix"),
        ((), {"profile_dir": "/tmp", "max_iterations": 3}, ValueError, "not supported by vjx"),
        ((), {}, RuntimeError, "Profiling is not enabled"),
    ],
)
def test_bad_profile_arguments_raise(llm, monkeypatch, args, kwargs, error, match):
    monkeypatch.delenv("VLLM_TORCH_PROFILER_DIR", raising=False)
    with pytest.raises(error, match=match):
        llm.start_profile(*args, **kwargs)


def test_collective_rpc_by_name_and_by_callable(llm):
    num_blocks = TINY_DEFAULT_ARGS["num_gpu_blocks_override"]
    assert llm.collective_rpc("get_kv_block_bytes") == [_worker(llm).get_kv_block_bytes()]
    assert llm.collective_rpc(worker_summary, args=("a",), kwargs={"scale": 2}) == [("a", 2 * num_blocks)]
    assert llm.collective_rpc(lambda worker: worker.mesh.size) == [1]


def test_apply_model(llm):
    assert llm.apply_model(model_class_name) == [type(_worker(llm).model).__name__]


def test_reset_prefix_cache(llm):
    llm.generate(PROMPTS[5], GREEDY, use_tqdm=False)
    assert llm.reset_prefix_cache() is True
    block_pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    assert not block_pool.cached_block_hash_to_block


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
TOOL_TEMPLATE = (
    "{% for tool in tools or [] %}TOOL {{ tool['function']['name'] }}\n{% endfor %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if flavor %}FLAVOR {{ flavor }}\n{% endif %}{% if add_generation_prompt %}assistant:{% endif %}"
)
PARTS_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endfor %}"
)
SHORT = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


def _chat_prompt(llm, messages, **kwargs) -> str:
    output = llm.chat(messages, SHORT, use_tqdm=False, **kwargs)[0]
    assert output.prompt_token_ids == llm.get_tokenizer().encode(output.prompt, add_special_tokens=False)
    return output.prompt


def test_chat_text_parts_render_as_joined_text(llm):
    tokenizer = llm.get_tokenizer()
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello\nthere"}], add_generation_prompt=True, tokenize=False
    )
    assert _chat_prompt(llm, parts) == expected


def test_chat_passes_tools_and_template_kwargs(llm):
    messages = [{"role": "user", "content": "Weather?"}]
    expected = llm.get_tokenizer().apply_chat_template(
        messages, tools=TOOLS, chat_template=TOOL_TEMPLATE, add_generation_prompt=True, tokenize=False, flavor="x"
    )
    rendered = _chat_prompt(
        llm, messages, chat_template=TOOL_TEMPLATE, tools=TOOLS, chat_template_kwargs={"flavor": "x"}
    )
    assert rendered == expected
    assert rendered.startswith("TOOL get_weather\n") and "FLAVOR x" in rendered


def test_chat_continue_final_message(llm):
    messages = [{"role": "user", "content": "Count:"}, {"role": "assistant", "content": "1, 2,"}]
    expected = llm.get_tokenizer().apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True, tokenize=False
    )
    assert _chat_prompt(llm, messages, add_generation_prompt=False, continue_final_message=True) == expected
    assert expected.endswith("1, 2,")
    with pytest.raises(ValueError, match="Cannot set both"):
        llm.chat(messages, SHORT, use_tqdm=False, continue_final_message=True)


def test_chat_openai_content_format(llm):
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]
    assert _chat_prompt(llm, messages, chat_template=PARTS_TEMPLATE) == "user:[a][b]"
    with pytest.raises(ValueError, match="chat_template_content_format"):
        llm.chat(messages, SHORT, use_tqdm=False, chat_template_content_format="markdown")


def test_the_constructors_chat_template_is_chats_default(llm, monkeypatch):
    assert llm.chat_template.endswith(TEMPLATE_MARK)
    messages = [{"role": "user", "content": "Weather?"}]
    monkeypatch.setattr(llm, "chat_template", TOOL_TEMPLATE)
    assert _chat_prompt(llm, messages) == "user: Weather?\nassistant:"
    assert _chat_prompt(llm, messages, chat_template=PARTS_TEMPLATE) == "user:[Weather?]"


def test_a_chat_template_path_that_cannot_be_read_fails_before_the_engine_starts(monkeypatch):
    monkeypatch.setattr(LLMEngine, "from_engine_args", None)  # reached only past the template
    with pytest.raises(ValueError, match="chat_template 'no_such.jinja' looks like a file path"):
        LLM(chat_template="no_such.jinja")


def test_chat_batch_of_conversations(llm):
    conversations = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]]
    outputs = llm.chat(conversations, SHORT, use_tqdm=False, priority=[1, 0])
    assert ["Hi" in outputs[0].prompt, "Bye" in outputs[1].prompt] == [True, True]


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "serves text models"),
        ([{"content": "no role"}], "role"),
        ("hello", "messages must be"),
    ],
)
def test_bad_chat_messages_raise(llm, messages, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, SHORT, use_tqdm=False)


def test_lora_requests_need_enable_lora(llm):
    adapter = LoRARequest("sql", 1, "/adapters/sql")
    with pytest.raises(ValueError, match="lora_request 'sql' needs an engine started with enable_lora=True"):
        llm.chat([{"role": "user", "content": "Hi"}], SHORT, use_tqdm=False, lora_request=adapter)
    with pytest.raises(ValueError, match="lora_request must be a LoRARequest, one per prompt, or None; got object"):
        llm.generate(PROMPTS[0], GREEDY, use_tqdm=False, lora_request=object())
    with pytest.raises(ValueError, match="lora_request must be a vjx LoRARequest or None, got dict"):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=[{"lora_name": "sql"}])
    with pytest.raises(ValueError, match=r"lora_request must be one LoRARequest or 2 \(one per prompt\), got 1"):
        llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False, lora_request=[adapter])
    assert not llm.llm_engine.has_unfinished_requests()
