"""Per-request speculative decoding metrics end to end through `LLM`: one n-gram engine at
`per_request_spec_decode_metrics="detailed"` on prompts that repeat. A request's figures agree
with its verify steps, with the scheduler's totals and with its output's length; each child of
an n > 1 request has its own; a request a stop string ends carries none (as in vLLM)."""

import pytest

from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx import LLM, SamplingParams

# test_ngram_engine.py's engine shapes, so the compiled steps come from the persistent cache.
ENGINE_ARGS = dict(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32, num_gpu_blocks_override=40, seed=0)
SPECULATIVE_CONFIG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
K = SPECULATIVE_CONFIG["num_speculative_tokens"]
PROMPTS = [
    "one two three four one two three four one two three four one two",
    "a b c d e f a b c d e f a b c d e f a b",
    "the cat sat on the mat and the cat sat on the mat and the cat",
]
GREEDY = SamplingParams(max_tokens=48, temperature=0.0)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = save_tiny_default_model(tmp_path_factory.mktemp("tiny"))
    engine = LLM(
        model, speculative_config=SPECULATIVE_CONFIG, per_request_spec_decode_metrics="detailed", **ENGINE_ARGS
    )
    yield engine
    engine.shutdown()


def _scheduler(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.scheduler


def test_a_requests_figures_add_up_to_its_steps_and_tokens(llm):
    scheduler = _scheduler(llm)
    assert (scheduler.num_spec_tokens, scheduler.spec_decode_metrics_level) == (K, "detailed")
    num_steps_before, stats_before = scheduler.num_steps, scheduler.spec_decoding_stats
    [output] = llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    completion = output.outputs[0]
    metrics = completion.spec_decode_metrics.to_dict()
    accepted, drafted = metrics["per_step_accepted"], metrics["per_step_drafted"]
    totals = scheduler.spec_decoding_stats - stats_before
    assert metrics["num_spec_steps"] == len(accepted) == len(drafted) == totals.num_drafts > 0
    assert metrics["num_accepted_draft_tokens"] == sum(accepted) == totals.num_accepted_tokens > 0
    assert metrics["num_draft_tokens"] == sum(drafted) == totals.num_draft_tokens
    assert metrics["acceptance_histogram"] == [accepted.count(j) for j in range(K + 1)]
    assert all(0 <= a <= d <= K for a, d in zip(accepted, drafted))
    assert metrics["mean_acceptance_length"] == 1 + sum(accepted) / len(accepted)
    assert metrics["draft_acceptance_rate"] == sum(accepted) / sum(drafted)
    # The prompt takes one step; every step keeps its accepted drafts and the token drawn after
    # them, except that the last may draw past max_tokens (at most its accepted drafts).
    num_steps = scheduler.num_steps - num_steps_before
    num_dropped = num_steps + sum(accepted) - len(completion.token_ids)
    assert completion.finish_reason == "length" and 0 <= num_dropped <= accepted[-1]


def test_each_sequence_of_an_n2_request_has_its_own_figures(llm):
    scheduler = _scheduler(llm)
    stats_before = scheduler.spec_decoding_stats
    # top_k=1 (greedy refuses n > 1): the tiny random model's sampled tokens hardly ever repeat,
    # so they would draw no drafts.
    params = SamplingParams(max_tokens=24, temperature=1.0, top_k=1, n=2, seed=5)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    metrics = [c.spec_decode_metrics.to_dict() for output in outputs for c in output.outputs]
    assert len({id(c.spec_decode_metrics) for output in outputs for c in output.outputs}) == len(metrics) == 6
    # The two children of a prompt draw the same tokens, so the same drafts.
    assert metrics[0::2] == metrics[1::2]
    totals = scheduler.spec_decoding_stats - stats_before
    assert sum(m["num_spec_steps"] for m in metrics) == totals.num_drafts
    assert sum(m["num_draft_tokens"] for m in metrics) == totals.num_draft_tokens
    assert sum(m["num_accepted_draft_tokens"] for m in metrics) == totals.num_accepted_tokens > 0


def test_a_request_a_stop_string_ends_carries_no_figures(llm):
    [whole] = llm.generate(PROMPTS[2:], GREEDY, use_tqdm=False)
    text = whole.outputs[0].text
    stop = text[6:10]
    [stopped] = llm.generate(PROMPTS[2:], SamplingParams(max_tokens=48, temperature=0.0, stop=[stop]), use_tqdm=False)
    completion = stopped.outputs[0]
    assert (completion.text, completion.finish_reason, completion.stop_reason) == (
        text[: text.index(stop)],
        "stop",
        stop,
    )
    assert whole.outputs[0].spec_decode_metrics is not None and completion.spec_decode_metrics is None
