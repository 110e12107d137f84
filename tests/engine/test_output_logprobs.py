"""Logprobs in the output processor: hand-built LogprobsLists -> Logprob dicts, cumulative
sums, DELTA slices, stop-string truncation, prompt logprobs and detokenize=False."""

import pytest

from tests.helpers.core_requests import core_request
from tests.helpers.tokenizer import EOS, text_ids
from vjx.engine.logprobs import LogprobsProcessor, TokenDecoder
from vjx.engine.messages import EngineCoreOutput, FinishReason
from vjx.engine.output_processor import OutputProcessor
from vjx.outputs import Logprob, LogprobsLists
from vjx.sampling_params import RequestOutputKind

HE, LLO, SPACE, W, OR = 273, 272, 222, 88, 291  # "He", "llo", " ", "w", "or"


def _rows(*rows: tuple[list[int], list[float], int]) -> LogprobsLists:
    """Rows of (token ids: chosen first, their logprobs, the chosen token's rank)."""
    return LogprobsLists([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])


@pytest.fixture
def processor(tokenizer):
    return OutputProcessor(tokenizer)


def _add(processor, tokenizer, **params):
    processor.add_request(core_request(tokenizer, **params), "The")


def test_logprob_dicts_hold_the_sampled_token_and_the_candidates(tokenizer, processor):
    _add(processor, tokenizer, logprobs=2)
    lists = _rows(
        ([HE, SPACE, W], [-1.5, -0.25, -0.5], 3),  # sampled "He" is third best
        ([LLO, LLO, OR], [-0.125, -0.125, -3.0], 1),  # sampled "llo" is the best: one entry
    )
    (output,) = processor.process_outputs([EngineCoreOutput("r", [HE, LLO], new_logprobs=lists)]).request_outputs
    completion = output.outputs[0]
    assert completion.logprobs == [
        {HE: Logprob(-1.5, 3, "He"), SPACE: Logprob(-0.25, 1, " "), W: Logprob(-0.5, 2, "w")},
        {LLO: Logprob(-0.125, 1, "llo"), OR: Logprob(-3.0, 2, "or")},
    ]
    assert list(completion.logprobs[0]) == [HE, SPACE, W]
    assert completion.cumulative_logprob == -1.625
    assert (completion.text, completion.token_ids) == ("Hello", [HE, LLO])


def test_no_logprobs_asked_gives_none(tokenizer, processor):
    _add(processor, tokenizer)
    (output,) = processor.process_outputs([EngineCoreOutput("r", [HE])]).request_outputs
    assert (output.outputs[0].logprobs, output.outputs[0].cumulative_logprob, output.prompt_logprobs) == (
        None,
        None,
        None,
    )


def test_logprobs_zero_and_wide_rows_are_cut_to_what_was_asked(tokenizer, processor):
    _add(processor, tokenizer, logprobs=0)
    lists = _rows(([W, HE, LLO], [-2.0, -1.0, -1.5], 4))
    (output,) = processor.process_outputs([EngineCoreOutput("r", [W], new_logprobs=lists)]).request_outputs
    assert output.outputs[0].logprobs == [{W: Logprob(-2.0, 4, "w")}]


def test_cumulative_and_delta_outputs_across_steps(tokenizer, processor):
    for request_id, kind in (("c", RequestOutputKind.CUMULATIVE), ("d", RequestOutputKind.DELTA)):
        processor.add_request(core_request(tokenizer, request_id, logprobs=1, output_kind=kind), None)
    steps = [(HE, [-1.0, -0.5], 2, SPACE), (LLO, [-0.25, -0.25], 1, LLO), (SPACE, [-4.0, -1.0], 7, W)]
    seen = {"c": [], "d": []}
    for token, logprobs, rank, best in steps:
        outputs = [
            EngineCoreOutput(request_id, [token], new_logprobs=_rows(([token, best], logprobs, rank)))
            for request_id in ("c", "d")
        ]
        for output in processor.process_outputs(outputs).request_outputs:
            seen[output.request_id].append(output.outputs[0])
    first, second, third = ({HE: Logprob(-1.0, 2, "He"), SPACE: Logprob(-0.5, 1, " ")},
                            {LLO: Logprob(-0.25, 1, "llo")},
                            {SPACE: Logprob(-4.0, 7, " "), W: Logprob(-1.0, 1, "w")})  # fmt: skip
    assert [c.logprobs for c in seen["c"]] == [[first], [first, second], [first, second, third]]
    assert [c.logprobs for c in seen["d"]] == [[first], [second], [third]]
    assert [c.cumulative_logprob for c in seen["d"]] == [-1.0, -1.25, -5.25]
    assert [c.cumulative_logprob for c in seen["c"]] == [-1.0, -1.25, -5.25]


def test_stop_string_drops_the_logprobs_of_dropped_tokens(tokenizer, processor):
    token_ids = text_ids(tokenizer, "Hello world, hello vjx!")
    _add(processor, tokenizer, logprobs=0, stop=["wo"])
    lists = _rows(*[([t], [-0.5 * (i + 1)], i + 1) for i, t in enumerate(token_ids)])
    step = processor.process_outputs([EngineCoreOutput("r", token_ids, new_logprobs=lists)])
    completion = step.request_outputs[0].outputs[0]
    # "w", "or" completed "wo": the 5 tokens up to it stay, with their logprobs only.
    assert completion.token_ids == token_ids[:5] and completion.text == "Hello "
    assert [list(d) for d in completion.logprobs] == [[t] for t in token_ids[:5]]
    assert completion.cumulative_logprob == -0.5 * (1 + 2 + 3 + 4 + 5)
    assert step.reqs_to_abort == ["r"]


def test_eos_keeps_its_logprob(tokenizer, processor):
    _add(processor, tokenizer, logprobs=0)
    lists = _rows(([HE], [-1.0], 1), ([EOS], [-0.5], 1))
    (output,) = processor.process_outputs(
        [EngineCoreOutput("r", [HE, EOS], FinishReason.STOP, new_logprobs=lists)]
    ).request_outputs
    completion = output.outputs[0]
    assert (completion.text, completion.token_ids) == ("He", [HE, EOS])
    assert completion.logprobs == [{HE: Logprob(-1.0, 1, "He")}, {EOS: Logprob(-0.5, 1, "<eos>")}]
    assert completion.cumulative_logprob == -1.5


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA])
def test_prompt_logprobs(tokenizer, processor, kind):
    prompt_ids = tokenizer.encode("The")  # <bos>, "The"
    assert len(prompt_ids) == 2
    _add(processor, tokenizer, prompt_logprobs=1, output_kind=kind)
    prompt_lists = _rows(([prompt_ids[1], W], [-3.0, -0.75], 5))
    first = processor.process_outputs([EngineCoreOutput("r", [HE], new_prompt_logprobs=prompt_lists)])
    second = processor.process_outputs([EngineCoreOutput("r", [LLO])])
    expected = [None, {prompt_ids[1]: Logprob(-3.0, 5, "The"), W: Logprob(-0.75, 1, "w")}]
    assert first.request_outputs[0].prompt_logprobs == expected
    later = [] if kind == RequestOutputKind.DELTA else expected
    assert second.request_outputs[0].prompt_logprobs == later
    assert first.request_outputs[0].outputs[0].logprobs is None


def test_prompt_logprobs_of_chunks_without_tokens_wait_for_the_first_token(tokenizer, processor):
    _add(processor, tokenizer, prompt_logprobs=0)
    chunk = processor.process_outputs([EngineCoreOutput("r", [], new_prompt_logprobs=_rows(([W], [-2.0], 9)))])
    assert chunk.request_outputs == []
    (output,) = processor.process_outputs(
        [EngineCoreOutput("r", [HE], new_prompt_logprobs=_rows(([OR], [-1.0], 3)))]
    ).request_outputs
    assert output.prompt_logprobs == [None, {W: Logprob(-2.0, 9, "w")}, {OR: Logprob(-1.0, 3, "or")}]


def test_detokenize_false_keeps_token_ids_and_no_text(tokenizer, processor):
    token_ids = text_ids(tokenizer, "Hello world")
    _add(processor, tokenizer, detokenize=False, logprobs=1, output_kind=RequestOutputKind.DELTA)
    lists = _rows(*[([t, W], [-1.0, -0.5], 2) for t in token_ids[:2]])
    first = processor.process_outputs([EngineCoreOutput("r", token_ids[:2], new_logprobs=lists)])
    last = processor.process_outputs([EngineCoreOutput("r", token_ids[2:], FinishReason.LENGTH)])
    completions = [first.request_outputs[0].outputs[0], last.request_outputs[0].outputs[0]]
    assert [(c.text, c.token_ids) for c in completions] == [("", token_ids[:2]), ("", token_ids[2:])]
    assert completions[0].logprobs[0] == {token_ids[0]: Logprob(-1.0, 2, None), W: Logprob(-0.5, 1, None)}
    assert completions[1].finish_reason == "length"


def test_processor_alone(tokenizer):
    logprobs = LogprobsProcessor(TokenDecoder(tokenizer), num_logprobs=1, num_prompt_logprobs=None)
    logprobs.update_sample_logprobs(_rows(([HE, W], [-1.0, -0.5], 2), ([LLO, LLO], [-0.5, -0.5], 1)), 1)
    assert logprobs.logprobs == [{HE: Logprob(-1.0, 2, "He"), W: Logprob(-0.5, 1, "w")}]
    assert logprobs.cumulative_logprob == -1.0
    assert logprobs.prompt_logprobs is None and logprobs.pop_prompt_logprobs() is None
