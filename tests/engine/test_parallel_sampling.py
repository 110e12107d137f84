"""Parallel sampling (n > 1): children's ids and seeds, aggregation per output kind, aborts;
then through `LLM` / `LLMEngine` on the fake engine core."""

import dataclasses

import pytest

from tests.helpers.core_requests import core_request
from tests.helpers.fake_engine_core import make_llm
from vjx.engine.messages import EngineCoreOutput, FinishReason
from vjx.engine.output_processor import OutputProcessor
from vjx.engine.parallel_sampling import ParentRequest
from vjx.outputs import Logprob, LogprobsLists
from vjx.sampling_params import RequestOutputKind, SamplingParams

HE, LLO, SPACE, W = 273, 272, 222, 88
LENGTH = FinishReason.LENGTH


def _parent(tokenizer, n: int = 4, **params) -> ParentRequest:
    return ParentRequest(core_request(tokenizer, "p", n=n, **params), "The")


def _add_family(processor: OutputProcessor, parent: ParentRequest) -> None:
    processor.add_parent_request(parent)
    for index in range(parent.sampling_params.n):
        processor.add_request(parent.make_child_request(index), parent.prompt, parent, index)


def _summary(request_outputs):
    return [
        (o.request_id, o.finished, [(c.index, c.text, c.finish_reason) for c in o.outputs]) for o in request_outputs
    ]


@pytest.mark.parametrize("seed, seeds", [(None, [None] * 4), (10, [10, 11, 12, 13])])
def test_children_ids_and_params(tokenizer, seed, seeds):
    parent = _parent(tokenizer, seed=seed, temperature=0.8, max_tokens=7)
    children = [parent.make_child_request(i) for i in range(4)]
    assert [c.request_id for c in children] == ["0_p", "1_p", "2_p", "3_p"]
    assert [c.sampling_params.seed for c in children] == seeds
    assert {(c.sampling_params.n, c.sampling_params.temperature, c.sampling_params.max_tokens) for c in children} == {
        (1, 0.8, 7)
    }
    assert all(c.prompt_token_ids == parent.request.prompt_token_ids for c in children)
    assert parent.get_child_info(2) == ("2_p", children[2].sampling_params)
    assert parent.sampling_params.n == 4 and parent.sampling_params.seed == seed


def test_cumulative_aggregates_all_completions_so_far_by_index(tokenizer):
    processor = OutputProcessor(tokenizer)
    _add_family(processor, _parent(tokenizer))
    steps = [
        [EngineCoreOutput("2_p", [W]), EngineCoreOutput("0_p", [HE])],
        [EngineCoreOutput("3_p", [SPACE], LENGTH), EngineCoreOutput("1_p", [LLO]), EngineCoreOutput("0_p", [LLO])],
        [EngineCoreOutput("1_p", [W], LENGTH), EngineCoreOutput("0_p", [SPACE], LENGTH)],
        [EngineCoreOutput("2_p", [HE], LENGTH)],
    ]
    seen = [_summary(processor.process_outputs(step).request_outputs) for step in steps]
    assert seen == [
        [("p", False, [(0, "He", None), (2, "w", None)])],
        [("p", False, [(0, "Hello", None), (1, "llo", None), (2, "w", None), (3, " ", "length")])],
        [("p", False, [(0, "Hello ", "length"), (1, "llow", "length"), (2, "w", None), (3, " ", "length")])],
        [("p", True, [(0, "Hello ", "length"), (1, "llow", "length"), (2, "wHe", "length"), (3, " ", "length")])],
    ]
    assert not processor.has_unfinished_requests() and processor.parent_requests == {}


def test_delta_gives_this_steps_completions_only(tokenizer):
    processor = OutputProcessor(tokenizer)
    _add_family(processor, _parent(tokenizer, n=2, output_kind=RequestOutputKind.DELTA))
    first = processor.process_outputs([EngineCoreOutput("1_p", [HE]), EngineCoreOutput("0_p", [W])])
    second = processor.process_outputs([EngineCoreOutput("1_p", [LLO], LENGTH)])
    third = processor.process_outputs([EngineCoreOutput("0_p", [HE], LENGTH)])
    assert _summary(first.request_outputs + second.request_outputs + third.request_outputs) == [
        ("p", False, [(0, "w", None), (1, "He", None)]),
        ("p", False, [(1, "llo", "length")]),
        ("p", True, [(0, "He", "length")]),
    ]


def test_final_only_waits_for_every_child(tokenizer):
    processor = OutputProcessor(tokenizer)
    _add_family(processor, _parent(tokenizer, n=3, output_kind=RequestOutputKind.FINAL_ONLY))
    steps = [
        [EngineCoreOutput("0_p", [HE]), EngineCoreOutput("1_p", [W], LENGTH), EngineCoreOutput("2_p", [W])],
        [EngineCoreOutput("0_p", [LLO], LENGTH), EngineCoreOutput("2_p", [SPACE])],
        [EngineCoreOutput("2_p", [HE], LENGTH)],
    ]
    seen = [_summary(processor.process_outputs(step).request_outputs) for step in steps]
    assert seen == [[], [], [("p", True, [(0, "Hello", "length"), (1, "w", "length"), (2, "w He", "length")])]]


def test_parent_and_single_requests_keep_the_step_order(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request(core_request(tokenizer, "a"), None)
    _add_family(processor, _parent(tokenizer, n=2))
    step = [EngineCoreOutput("1_p", [HE]), EngineCoreOutput("a", [W]), EngineCoreOutput("0_p", [LLO])]
    assert _summary(processor.process_outputs(step).request_outputs) == [
        ("p", False, [(0, "llo", None), (1, "He", None)]),
        ("a", False, [(0, "w", None)]),
    ]


def test_stop_string_of_one_child_aborts_only_that_child(tokenizer):
    processor = OutputProcessor(tokenizer)
    _add_family(processor, _parent(tokenizer, n=2, stop=["llo"]))
    step = processor.process_outputs([EngineCoreOutput("0_p", [HE, LLO]), EngineCoreOutput("1_p", [W])])
    assert step.reqs_to_abort == ["0_p"]
    # Child 1's "w" is held back: it may be the start of a stop string.
    assert _summary(step.request_outputs) == [("p", False, [(0, "He", "stop"), (1, "", None)])]
    assert processor.get_num_unfinished_requests() == 1


def test_abort_parent_aborts_its_unfinished_children(tokenizer):
    processor = OutputProcessor(tokenizer)
    _add_family(processor, _parent(tokenizer, n=3))
    processor.process_outputs([EngineCoreOutput("1_p", [HE], LENGTH)])
    assert processor.abort_requests(["p"]) == ["0_p", "2_p"]
    assert not processor.has_unfinished_requests() and processor.parent_requests == {}
    assert processor.process_outputs([EngineCoreOutput("0_p", [W])]).request_outputs == []
    assert processor.abort_requests(["p"]) == []


def test_ids_in_use_are_refused_before_anything_is_tracked(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request(core_request(tokenizer, "2_p"), None)
    with pytest.raises(ValueError, match="request_id '2_p' is already in use"):
        _add_family(processor, _parent(tokenizer))
    assert list(processor.request_states) == ["2_p"] and processor.parent_requests == {}
    _add_family(processor, _parent(tokenizer, n=2))
    with pytest.raises(ValueError, match="request_id 'p' is already in use"):
        processor.add_request(core_request(tokenizer, "p"), None)


def test_prompt_logprobs_are_given_once_per_parent(tokenizer):
    processor = OutputProcessor(tokenizer)
    _add_family(processor, _parent(tokenizer, n=2, prompt_logprobs=0, output_kind=RequestOutputKind.DELTA))
    prompt_ids = tokenizer.encode("The")
    lists = LogprobsLists([[prompt_ids[1]]], [[-2.5]], [4])
    first = processor.process_outputs([EngineCoreOutput("0_p", [HE], new_prompt_logprobs=lists)])
    second = processor.process_outputs([EngineCoreOutput("1_p", [W], new_prompt_logprobs=lists)])
    assert first.request_outputs[0].prompt_logprobs == [None, {prompt_ids[1]: Logprob(-2.5, 4, "The")}]
    assert second.request_outputs[0].prompt_logprobs == []


def test_num_cached_tokens_is_the_first_computation(tokenizer):
    processor = OutputProcessor(tokenizer)
    _add_family(processor, _parent(tokenizer, n=2))
    step = [EngineCoreOutput("0_p", [HE], num_cached_tokens=0), EngineCoreOutput("1_p", [HE], num_cached_tokens=16)]
    assert processor.process_outputs(step).request_outputs[0].num_cached_tokens == 0


def test_generate_n_through_the_engine(tmp_path, monkeypatch):
    llm = make_llm(tmp_path, monkeypatch)
    core = llm.llm_engine.engine_core
    params = SamplingParams(n=4, seed=3, temperature=1.0, max_tokens=6, ignore_eos=True, logprobs=1)
    (output,) = llm.generate("Hello", params, use_tqdm=False)
    assert [(r.request_id, r.sampling_params.n, r.sampling_params.seed) for r in core.added] == [
        ("0_0", 1, 3), ("1_0", 1, 4), ("2_0", 1, 5), ("3_0", 1, 6),
    ]  # fmt: skip
    assert output.request_id == "0" and output.finished
    assert [c.index for c in output.outputs] == [0, 1, 2, 3]
    # Child i samples exactly as a single request seeded seed + i.
    single_params = [dataclasses.replace(params, n=1, seed=3 + i) for i in range(4)]
    singles = llm.generate(["Hello"] * 4, single_params, use_tqdm=False)
    assert [c.token_ids for c in output.outputs] == [s.outputs[0].token_ids for s in singles]
    assert len({tuple(c.token_ids) for c in output.outputs}) == 4
    for completion in output.outputs:
        assert len(completion.logprobs) == 6
        assert completion.cumulative_logprob == pytest.approx(
            sum(d[t].logprob for d, t in zip(completion.logprobs, completion.token_ids))
        )


def test_abort_parent_through_the_engine(tmp_path, monkeypatch):
    engine = make_llm(tmp_path, monkeypatch).llm_engine
    engine.add_request("p", "Hello", SamplingParams(n=3, max_tokens=5, ignore_eos=True))
    assert len(engine.step()[0].outputs) == 3
    engine.abort_request(["p"])
    assert engine.engine_core.aborted == ["0_p", "1_p", "2_p"]
    assert not engine.has_unfinished_requests() and engine.engine_core.running == {}
