"""IncrementalDetokenizer and OutputProcessor on a real byte-level BPE tokenizer.

The tokenizer (tests/helpers/tokenizer.py) is trained in memory on a few sentences (no
download); its CJK and emoji characters are split over several byte tokens, which is what
the multi-byte tests need.
"""

import random

import pytest

from tests.helpers.core_requests import core_request
from tests.helpers.tokenizer import BOS, EOS, text_ids
from vjx.engine.detokenizer import IncrementalDetokenizer
from vjx.engine.messages import EngineCoreOutput, EngineCoreRequest, FinishReason
from vjx.engine.output_processor import OutputProcessor
from vjx.sampling_params import RequestOutputKind, SamplingParams


def _stream(detokenizer: IncrementalDetokenizer, token_ids: list[int], chunk_sizes: list[int]) -> list[str]:
    """Feeds the tokens in chunks, the last one finishing by length; returns the deltas."""
    deltas, start = [], 0
    for i, size in enumerate(chunk_sizes):
        is_last = i == len(chunk_sizes) - 1
        chunk = token_ids[start:] if is_last else token_ids[start : start + size]
        start += size
        assert detokenizer.update(chunk, FinishReason.LENGTH if is_last else None) is None
        deltas.append(detokenizer.get_next_output_text(finished=is_last, delta=True))
    return deltas


def test_tokenizer_splits_text_as_the_tests_expect(tokenizer):
    pieces = [tokenizer.decode([t]) for t in text_ids(tokenizer, "Hello world, hello vjx!")]
    assert pieces == ["He", "llo", " ", "w", "or", "ld", ",", " he", "llo", " ", "vjx", "!"]
    assert tokenizer.encode("Hi")[0] == BOS
    assert tokenizer.convert_ids_to_tokens([BOS, EOS]) == ["<bos>", "<eos>"]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("has_backend", [True, False])
def test_deltas_join_to_decode_of_random_tokens(tokenizer, skip_special_tokens, has_backend, monkeypatch):
    if not has_backend:
        # As a Python tokenizer (no Rust backend): windows go through `tokenizer.decode`.
        monkeypatch.setattr(type(tokenizer), "backend_tokenizer", None)
    rng = random.Random(0)
    for _ in range(200):
        prompt_ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 8))]
        token_ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 40))]
        request = EngineCoreRequest("r", prompt_ids, SamplingParams(skip_special_tokens=skip_special_tokens), EOS, 0.0)
        detokenizer = IncrementalDetokenizer(tokenizer, request)
        chunk_sizes = [rng.randrange(1, 4) for _ in range(len(token_ids))]
        deltas = _stream(detokenizer, token_ids, chunk_sizes)
        expected = tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        assert "".join(deltas) == detokenizer.output_text == expected
        assert detokenizer.output_token_ids == token_ids


def test_multi_byte_characters_are_never_emitted_half_done(tokenizer):
    text = "日本語のテキスト 😀🎉 done"
    token_ids = text_ids(tokenizer, text)
    request = core_request(tokenizer, prompt="Hello")
    detokenizer = IncrementalDetokenizer(tokenizer, request)
    deltas = _stream(detokenizer, token_ids, [1] * len(token_ids))
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)
    # A character's first tokens (one or two of its bytes) wait for the rest of it.
    assert deltas == [
        "", "", "日", "", "", "本", "", "", "語", "", "の", "", "テ", "", "キ", "", "ス", "", "ト",
        "", "", " 😀", "", "", "🎉", " ", "do", "n", "e",
    ]  # fmt: skip


def test_incomplete_character_at_the_end_shows_as_decode_shows_it(tokenizer):
    token_ids = text_ids(tokenizer, "ok 日")[:-1]
    detokenizer = IncrementalDetokenizer(tokenizer, core_request(tokenizer))
    assert detokenizer.update(token_ids, None) is None
    assert detokenizer.get_next_output_text(finished=False, delta=False) == "ok "
    detokenizer.update([], FinishReason.LENGTH)
    assert detokenizer.output_text == tokenizer.decode(token_ids) == "ok \ufffd"


@pytest.mark.parametrize("skip_special_tokens, text", [(True, "Hello world"), (False, "Hello<bos> world")])
def test_skip_special_tokens(tokenizer, skip_special_tokens, text):
    processor = OutputProcessor(tokenizer)
    processor.add_request(core_request(tokenizer, skip_special_tokens=skip_special_tokens), "The")
    token_ids = text_ids(tokenizer, "Hello") + [BOS] + text_ids(tokenizer, " world")
    (output,) = processor.process_outputs([EngineCoreOutput("r", token_ids)]).request_outputs
    assert output.outputs[0].text == text
    assert output.outputs[0].token_ids == token_ids


def _run_one(tokenizer, steps: list[list[int]], kind=RequestOutputKind.CUMULATIVE, **params):
    """Feeds `steps` to a fresh processor; returns (outputs, reqs_to_abort per step, processor)."""
    processor = OutputProcessor(tokenizer)
    request = core_request(tokenizer, output_kind=kind, **params)
    processor.add_request(request, "The")
    outputs, aborts = [], []
    for new_token_ids in steps:
        step = processor.process_outputs([EngineCoreOutput("r", new_token_ids)])
        outputs += step.request_outputs
        aborts.append(step.reqs_to_abort)
    return outputs, aborts, processor


def test_stop_string_spanning_two_tokens(tokenizer):
    token_ids = text_ids(tokenizer, "Hello world, hello vjx!")
    outputs, aborts, processor = _run_one(tokenizer, [[t] for t in token_ids[:9]], stop=[", he"])
    final = outputs[-1]
    assert len(outputs) == 8 and final.finished
    assert final.outputs[0].text == "Hello world"
    assert final.outputs[0].token_ids == token_ids[:8]
    assert (final.outputs[0].finish_reason, final.outputs[0].stop_reason) == ("stop", ", he")
    assert aborts[-2:] == [["r"], []]
    assert not processor.has_unfinished_requests()


def test_stop_string_mid_token_drops_later_tokens_of_the_step(tokenizer):
    token_ids = text_ids(tokenizer, "Hello world, hello vjx!")
    outputs, aborts, _ = _run_one(tokenizer, [token_ids], stop=["vjx", "wo"])
    (output,) = outputs
    assert output.outputs[0].text == "Hello "
    assert output.outputs[0].token_ids == token_ids[:5]  # ... "w", "or": "or" completed "wo".
    assert output.outputs[0].stop_reason == "wo"
    assert aborts == [["r"]]


def test_include_stop_str_in_output(tokenizer):
    token_ids = text_ids(tokenizer, "Hello world, hello vjx!")
    outputs, _, _ = _run_one(tokenizer, [token_ids], stop=["wo"], include_stop_str_in_output=True)
    assert outputs[0].outputs[0].text == "Hello wo"
    assert outputs[0].outputs[0].token_ids == token_ids[:5]


def test_stop_string_is_held_back_while_streaming(tokenizer):
    token_ids = text_ids(tokenizer, "Hello world, hello vjx!")
    steps = [[t] for t in token_ids[:9]]
    outputs, _, _ = _run_one(tokenizer, steps, kind=RequestOutputKind.DELTA, stop=[", he"])
    deltas = [output.outputs[0].text for output in outputs]
    # "He" (2 chars) < 3 held back: nothing yet; then each step shows what is 3 chars old.
    assert deltas == ["", "He", "l", "l", "o ", "wo", "r", "ld"]
    assert [output.outputs[0].token_ids for output in outputs] == [[t] for t in token_ids[:8]]
    assert "".join(deltas) == "Hello world"
    cumulative, _, _ = _run_one(tokenizer, steps, stop=[", he"])
    assert [output.outputs[0].text for output in cumulative][:4] == ["", "He", "Hel", "Hell"]


def test_earliest_stop_string_wins(tokenizer):
    token_ids = text_ids(tokenizer, "Hello world, hello vjx!")
    outputs, _, _ = _run_one(tokenizer, [token_ids], stop=["vjx", "hello", "lo"])
    assert (outputs[0].outputs[0].text, outputs[0].outputs[0].stop_reason) == ("Hel", "lo")


def test_stop_strings_wait_for_min_tokens(tokenizer):
    token_ids = text_ids(tokenizer, "Hello world, hello vjx!")
    outputs, _, _ = _run_one(tokenizer, [token_ids], stop=["llo"], min_tokens=3)
    assert outputs[0].outputs[0].text == "Hello world, he"
    assert outputs[0].outputs[0].token_ids == token_ids[:9]


@pytest.mark.parametrize("include_stop_str_in_output, text", [(False, "Hello world"), (True, "Hello world,")])
def test_stop_token_id_finishes_with_its_id(tokenizer, include_stop_str_in_output, text):
    token_ids = text_ids(tokenizer, "Hello world,")
    processor = OutputProcessor(tokenizer)
    request = core_request(
        tokenizer, stop_token_ids=[token_ids[-1]], include_stop_str_in_output=include_stop_str_in_output
    )
    processor.add_request(request, "The")
    core_output = EngineCoreOutput("r", token_ids, FinishReason.STOP, stop_reason=token_ids[-1])
    step = processor.process_outputs([core_output])
    completion = step.request_outputs[0].outputs[0]
    assert (completion.text, completion.token_ids) == (text, token_ids)
    assert (completion.finish_reason, completion.stop_reason) == ("stop", token_ids[-1])
    assert step.reqs_to_abort == []


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_eos_finishes_without_its_text(tokenizer, skip_special_tokens):
    token_ids = text_ids(tokenizer, "Hello") + [EOS]
    processor = OutputProcessor(tokenizer)
    processor.add_request(core_request(tokenizer, skip_special_tokens=skip_special_tokens), "The")
    (output,) = processor.process_outputs([EngineCoreOutput("r", token_ids, FinishReason.STOP)]).request_outputs
    assert (output.outputs[0].text, output.outputs[0].token_ids) == ("Hello", token_ids)
    assert (output.outputs[0].finish_reason, output.outputs[0].stop_reason) == ("stop", None)


def test_length_finish_and_cumulative_outputs(tokenizer):
    token_ids = text_ids(tokenizer, "Hello world")
    processor = OutputProcessor(tokenizer)
    processor.add_request(core_request(tokenizer, max_tokens=3), "The")
    first = processor.process_outputs([EngineCoreOutput("r", token_ids[:2])]).request_outputs[0]
    last = processor.process_outputs([EngineCoreOutput("r", token_ids[2:3], FinishReason.LENGTH)])
    (final,) = last.request_outputs
    assert (first.finished, first.outputs[0].text, first.outputs[0].token_ids) == (False, "Hello", token_ids[:2])
    assert (final.finished, final.outputs[0].text, final.outputs[0].token_ids) == (True, "Hello ", token_ids[:3])
    assert (final.outputs[0].finish_reason, final.outputs[0].stop_reason) == ("length", None)
    assert (final.prompt, final.prompt_token_ids) == ("The", tokenizer.encode("The"))
    assert last.reqs_to_abort == [] and processor.get_num_unfinished_requests() == 0


def test_delta_and_final_only_kinds(tokenizer):
    token_ids = text_ids(tokenizer, "Hello world")
    steps = [token_ids[:2], token_ids[2:4], token_ids[4:]]
    processor = OutputProcessor(tokenizer)
    processor.add_request(core_request(tokenizer, "d", output_kind=RequestOutputKind.DELTA), None)
    processor.add_request(core_request(tokenizer, "f", output_kind=RequestOutputKind.FINAL_ONLY), None)
    seen = []
    for i, new_token_ids in enumerate(steps):
        finish_reason = FinishReason.LENGTH if i == len(steps) - 1 else None
        core_outputs = [EngineCoreOutput(r, new_token_ids, finish_reason) for r in ("d", "f")]
        seen += processor.process_outputs(core_outputs).request_outputs
    assert [(o.request_id, o.outputs[0].text, o.outputs[0].token_ids) for o in seen] == [
        ("d", "Hello", token_ids[:2]),
        ("d", " w", token_ids[2:4]),
        ("d", "orld", token_ids[4:]),
        ("f", "Hello world", token_ids),
    ]


def test_abort(tokenizer):
    processor = OutputProcessor(tokenizer)
    for request_id in ("a", "b", "c"):
        processor.add_request(core_request(tokenizer, request_id), None)
    assert processor.abort_requests(["a", "x", "a"]) == ["a"]
    step = processor.process_outputs(
        [EngineCoreOutput("a", [40]), EngineCoreOutput("b", [40], FinishReason.ABORT), EngineCoreOutput("c", [])]
    )
    (output,) = step.request_outputs
    assert (output.request_id, output.finished, output.outputs[0].finish_reason) == ("b", True, "abort")
    assert processor.get_num_unfinished_requests() == 1 and processor.has_unfinished_requests()


def test_duplicate_request_id_is_refused(tokenizer):
    processor = OutputProcessor(tokenizer)
    processor.add_request(core_request(tokenizer, "a"), None)
    with pytest.raises(ValueError, match="request_id 'a' is already in use"):
        processor.add_request(core_request(tokenizer, "a"), None)
