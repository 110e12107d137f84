"""Hostile and extreme requests through the offline `LLM` API: each is refused with a
`ValueError` or runs to completion, and the engine keeps generating.

Also: stop ids past the min_tokens table, a request the runner cannot take failing alone,
and a property test over every `SamplingParams` field at its extremes. One engine, on the
tiny stand-in for the default model (its tokenizer, vocabulary and generation config, two
small layers): what is checked is validation and completion, and requests without
`max_tokens` decode to the end of the context, hundreds of steps the default model would
spend minutes on.
"""

import dataclasses

import hypothesis
import pytest
from hypothesis import strategies as st

from tests.helpers.hostile_requests import INT32_MAX, INT64_MAX, MANY_STOP_IDS, SAMPLING_CASES, offline_request
from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from vjx import LLM, SamplingParams
from vjx.worker.input_batch import InputBatch

OFFLINE_CASES = [case for case in SAMPLING_CASES if case[4] is not None]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    engine = LLM(model=model, **TINY_DEFAULT_ARGS, async_scheduling=False)
    yield engine
    engine.shutdown()


def _stats(llm: LLM):
    return llm.llm_engine.engine_core.make_stats()


def _assert_idle(llm: LLM) -> None:
    stats = _stats(llm)
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)
    assert not llm.llm_engine.has_unfinished_requests()


def _generate(llm: LLM, prompt, **kwargs):
    return llm.generate(prompt, SamplingParams(**kwargs), use_tqdm=False)


def test_the_hostile_table_is_refused_or_runs(llm):
    assert len(OFFLINE_CASES) >= 35
    for name, changes, _, param, outcome in OFFLINE_CASES:
        prompt, kwargs = offline_request(changes)
        if outcome == "error":
            with pytest.raises(ValueError) as error:
                _generate(llm, prompt, **kwargs)
            if param is not None:
                assert str(error.value).startswith(param), (name, str(error.value))
        else:
            outputs = _generate(llm, prompt, **kwargs)[0].outputs
            assert all(c.finish_reason in ("stop", "length") for c in outputs), name
        good = _generate(llm, "Hello", max_tokens=2, temperature=0.0, ignore_eos=True)[0]
        assert len(good.outputs[0].token_ids) == 2, name
    _assert_idle(llm)


def test_one_token_prompt_has_prompt_logprobs_none(llm):
    output = _generate(llm, {"prompt_token_ids": [1]}, prompt_logprobs=5, max_tokens=2)[0]
    assert output.prompt_logprobs == [None]


def test_stop_ids_past_the_table_wait_for_min_tokens(llm):
    """A logit bias makes stop id 120 the greedy choice at once; min_tokens holds it back for
    five tokens, whether the stop ids fit the step's table (15) or not (40)."""
    biased = {120: 100.0}
    few = list(range(106, 121))
    held = {
        len(ids): _generate(llm, "Hi", stop_token_ids=ids, min_tokens=5, logit_bias=biased, temperature=0.0)[0]
        for ids in (few, MANY_STOP_IDS)
    }
    for output in held.values():
        completion = output.outputs[0]
        assert len(completion.token_ids) == 6 and completion.token_ids[-1] == 120
        assert not set(completion.token_ids[:5]) & set(MANY_STOP_IDS)
        assert (completion.finish_reason, completion.stop_reason) == ("stop", 120)
    assert held[15].outputs[0].token_ids == held[40].outputs[0].token_ids
    free = _generate(llm, "Hi", stop_token_ids=MANY_STOP_IDS, logit_bias=biased, temperature=0.0)[0].outputs[0]
    assert free.token_ids == [120]
    _assert_idle(llm)


def test_a_request_the_runner_cannot_take_fails_alone(llm, monkeypatch):
    marker = 7777
    add_request = InputBatch.add_request

    def failing_add_request(self, state, num_computed_tokens):
        if state.prompt_token_ids[0] == marker:
            raise RuntimeError("a request the batch cannot hold")
        return add_request(self, state, num_computed_tokens)

    monkeypatch.setattr(InputBatch, "add_request", failing_add_request)
    prompts = ["Hello there", {"prompt_token_ids": [marker, 5, 6]}, "The capital of France is"]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0), use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outputs] == ["length", "error", "length"]
    assert [len(o.outputs[0].token_ids) for o in outputs] == [8, 0, 8]
    _assert_idle(llm)


_INTS = [-(2**64), -(2**63) - 1, -(2**63), -(2**31) - 1, -2, -1, 0, 1, 2, 5, INT32_MAX, 2**31, INT64_MAX, 2**63]
_FLOATS = [float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 3.5e38, 1e30, -0.0, 0.0, 1e-45, 0.5, 1.0, 2.0]
_TOKEN_IDS = st.lists(st.sampled_from([-1, 0, 1, 120, 49151, 49152, 2**40]), max_size=20)
_FIELDS = {
    "n": st.sampled_from([1, 2, 1025, *_INTS]),
    "temperature": st.sampled_from(_FLOATS),
    "top_p": st.sampled_from(_FLOATS),
    "top_k": st.sampled_from(_INTS),
    "min_p": st.sampled_from(_FLOATS),
    "presence_penalty": st.sampled_from(_FLOATS),
    "frequency_penalty": st.sampled_from(_FLOATS),
    "repetition_penalty": st.sampled_from(_FLOATS),
    "seed": st.none() | st.sampled_from(_INTS),
    "max_tokens": st.none() | st.sampled_from(_INTS),
    "min_tokens": st.sampled_from(_INTS),
    "logprobs": st.none() | st.sampled_from([*_INTS, 20, 21]),
    "prompt_logprobs": st.none() | st.sampled_from([*_INTS, 20, 21]),
    "stop_token_ids": _TOKEN_IDS,
    "allowed_token_ids": st.none() | _TOKEN_IDS,
    "logit_bias": st.none() | st.dictionaries(st.sampled_from([0, 120, -1, 2**40]), st.sampled_from(_FLOATS)),
    "truncate_prompt_tokens": st.none() | st.sampled_from(_INTS),
    "ignore_eos": st.booleans(),
}
_PROMPTS = st.sampled_from(["Hello", {"prompt_token_ids": [1]}, {"prompt_token_ids": [1, 2, 3, 4, 5]}])


@st.composite
def _requests(draw):
    """A prompt and a dict of a few `SamplingParams` fields, each at an extreme."""
    names = draw(st.lists(st.sampled_from(sorted(_FIELDS)), min_size=1, max_size=5, unique=True))
    return draw(_PROMPTS), {name: draw(_FIELDS[name]) for name in names}


@hypothesis.settings(max_examples=4, deadline=None, database=None, derandomize=True)
@hypothesis.given(st.lists(_requests(), min_size=24, max_size=24))
def test_extreme_params_are_refused_or_run_to_completion(llm, requests):
    """Each example is a batch of 24 requests: the ones validation accepts run together,
    and every one of them completes (its tokens within its max_tokens and the context)."""
    accepted = []
    for prompt, fields in requests:
        try:
            params = SamplingParams(**fields)
            llm.llm_engine.input_processor.process_inputs("probe", prompt, params)
        except ValueError:
            continue
        accepted.append((prompt, dataclasses.replace(params, n=min(params.n, 2))))
    outputs = llm.generate([p for p, _ in accepted], [sp for _, sp in accepted], use_tqdm=False)
    max_model_len = TINY_DEFAULT_ARGS["max_model_len"]
    for output, (_, params) in zip(outputs, accepted):
        assert output.finished
        for completion in output.outputs:
            assert completion.finish_reason in ("stop", "length")
            assert len(completion.token_ids) <= min(params.max_tokens or INT64_MAX, max_model_len)
    _assert_idle(llm)
