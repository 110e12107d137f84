"""Beam search: the driver against a reference beam search on the fake engine core's tiny
model, then end to end on the tiny stand-in for the default model (SmolLM2-135M-Instruct's
tokenizer and vocabulary, two small random layers), scored against transformers."""

import numpy as np
import pytest
import torch
import transformers

from tests.helpers.fake_engine_core import MAX_MODEL_LEN, FakeModel, make_llm
from tests.helpers.large_engine import PROMPTS
from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from tests.helpers.tokenizer import EOS
from vjx import LLM, SamplingParams
from vjx.beam_search import BeamSearchParams, get_beam_search_score

MODEL = FakeModel()


def reference_beam_search(prompt_ids: list[int], params: BeamSearchParams) -> list[tuple[list[int], float, str]]:
    """(tokens, cumulative logprob, finish reason) of the best beams, written out plainly."""

    def score(beam):
        tokens, cum_logprob, _ = beam
        return cum_logprob / (len(tokens) - (tokens[-1] == EOS)) ** params.length_penalty

    live, done = [(prompt_ids, 0.0, "length")], []
    for _ in range(params.max_tokens):
        done += [beam for beam in live if len(beam[0]) >= MAX_MODEL_LEN]
        live = [beam for beam in live if len(beam[0]) < MAX_MODEL_LEN]
        candidates = []
        for tokens, cum_logprob, _ in live:
            logprobs = MODEL.logprobs(tokens)
            for token in np.argsort(-logprobs)[: 2 * params.beam_width]:
                candidates.append((tokens + [int(token)], cum_logprob + float(logprobs[token]), "length"))
        if not params.ignore_eos:
            keep_eos = params.include_stop_str_in_output
            done += [(t if keep_eos else t[:-1], c, "stop") for t, c, _ in candidates if t[-1] == EOS]
            candidates = [beam for beam in candidates if beam[0][-1] != EOS]
        live = sorted(candidates, key=score, reverse=True)[: params.beam_width]
    return sorted(done + live, key=score, reverse=True)[: params.beam_width]


@pytest.fixture
def fake_llm(tmp_path, monkeypatch):
    return make_llm(tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(beam_width=3, max_tokens=6),
        dict(beam_width=1, max_tokens=5),
        dict(beam_width=4, max_tokens=5, length_penalty=0.0),
        dict(beam_width=3, max_tokens=6, length_penalty=2.0, include_stop_str_in_output=True),
        dict(beam_width=2, max_tokens=6, ignore_eos=True),
    ],
)
def test_driver_matches_the_reference(fake_llm, kwargs):
    params = BeamSearchParams(**kwargs)
    tokenizer = fake_llm.get_tokenizer()
    prompts = ["The quick", {"prompt": "Hello"}, {"prompt_token_ids": [5, 9, 3]}]
    prompt_ids = [tokenizer.encode("The quick"), tokenizer.encode("Hello"), [5, 9, 3]]
    outputs = fake_llm.beam_search(prompts, params)
    assert len(outputs) == 3
    for output, ids in zip(outputs, prompt_ids):
        expected = reference_beam_search(ids, params)
        assert [(s.tokens, s.finish_reason) for s in output.sequences] == [(t, f) for t, _, f in expected]
        assert [s.cum_logprob for s in output.sequences] == pytest.approx([c for _, c, _ in expected])
        for sequence in output.sequences:
            output_ids = sequence.tokens[len(ids) :]
            if sequence.finish_reason == "stop":
                assert sequence.stop_reason == EOS
                assert (output_ids[-1] == EOS) == params.include_stop_str_in_output
                output_ids = [t for t in output_ids if t != EOS]
            assert sequence.text == tokenizer.decode(output_ids)
            assert all(len(d) == 2 * params.beam_width for d in sequence.logprobs)
            chosen = sequence.tokens[len(ids) :] + ([EOS] if len(sequence.logprobs) > len(output_ids) else [])
            assert sequence.cum_logprob == pytest.approx(sum(d[t].logprob for d, t in zip(sequence.logprobs, chosen)))


def test_some_beams_end_with_eos_and_scores_are_sorted(fake_llm):
    params = BeamSearchParams(beam_width=4, max_tokens=6)
    (output,) = fake_llm.beam_search(["The quick"], params)
    assert {s.finish_reason for s in output.sequences} == {"stop", "length"}
    scores = [get_beam_search_score(s.tokens, s.cum_logprob, EOS, 1.0) for s in output.sequences]
    assert scores == sorted(scores, reverse=True)


def test_each_step_is_one_generate_of_one_token_per_beam(fake_llm):
    core = fake_llm.llm_engine.engine_core
    fake_llm.beam_search(["Hello"], BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True))
    assert len(core.added) == 1 + 3 + 3 + 3
    assert {(r.sampling_params.logprobs, r.sampling_params.max_tokens) for r in core.added} == {(6, 1)}
    assert [len(r.prompt_token_ids) for r in core.added] == [3] + [4] * 3 + [5] * 3 + [6] * 3


def test_beams_stop_at_max_model_len(fake_llm):
    prompt = {"prompt_token_ids": list(range(10, 10 + MAX_MODEL_LEN - 2))}
    params = BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True)
    (output,) = fake_llm.beam_search([prompt], params)
    assert [len(s.tokens) for s in output.sequences] == [MAX_MODEL_LEN] * 2
    assert [s.finish_reason for s in output.sequences] == ["length"] * 2
    expected = reference_beam_search(prompt["prompt_token_ids"], params)
    assert [s.tokens for s in output.sequences] == [t for t, _, _ in expected]


@pytest.mark.parametrize(
    "kwargs, argument",
    [({"beam_width": 0, "max_tokens": 4}, "beam_width"), ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
     ({"beam_width": 2, "max_tokens": 4, "temperature": -1.0}, "temperature")],
)  # fmt: skip
def test_bad_params_raise(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        BeamSearchParams(**kwargs)


def test_beam_width_is_capped_by_max_logprobs(fake_llm):
    with pytest.raises(ValueError, match=r"logprobs=22 is more than max_logprobs=20"):
        fake_llm.beam_search(["Hello"], BeamSearchParams(beam_width=11, max_tokens=2))


# End to end on a real engine: needs the runner's logprobs.


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))
    return LLM(model=model, **TINY_DEFAULT_ARGS, async_scheduling=False)


def test_beam_width_one_is_greedy(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    expected = llm.generate(PROMPTS[:2], greedy, use_tqdm=False)
    outputs = llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=1, max_tokens=8, ignore_eos=True))
    for output, reference in zip(outputs, expected):
        (sequence,) = output.sequences
        assert sequence.tokens == reference.prompt_token_ids + reference.outputs[0].token_ids
        assert sequence.cum_logprob == pytest.approx(reference.outputs[0].cumulative_logprob, abs=1e-4)


def test_beams_score_what_the_model_gives_them(llm):
    """Each beam's cumulative logprob is what transformers gives its tokens (EOS included)."""
    (output,) = llm.beam_search([PROMPTS[2]], BeamSearchParams(beam_width=3, max_tokens=6))
    tokenizer, eos = llm.get_tokenizer(), llm.get_tokenizer().eos_token_id
    num_prompt_tokens = len(tokenizer.encode(PROMPTS[2]))
    assert len({tuple(s.tokens) for s in output.sequences}) == 3
    scores = [get_beam_search_score(s.tokens, s.cum_logprob, eos, 1.0) for s in output.sequences]
    assert scores == sorted(scores, reverse=True)
    rows = [s.tokens + ([eos] if s.finish_reason == "stop" else []) for s in output.sequences]
    width = max(map(len, rows))
    config = llm.llm_engine.config.model_config
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32).eval()
    with torch.no_grad():
        # Right padding leaves every real position's logits as they are (causal attention).
        logits = hf_model(torch.as_tensor([row + [0] * (width - len(row)) for row in rows])).logits
    logprobs = torch.log_softmax(logits, -1)
    for sequence, row, row_logprobs in zip(output.sequences, rows, logprobs):
        expected = sum(float(row_logprobs[i - 1, row[i]]) for i in range(num_prompt_tokens, len(row)))
        assert sequence.cum_logprob == pytest.approx(expected, abs=1e-3)
