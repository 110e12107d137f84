"""The output processor's IterationStats from hand-built EngineCore outputs: exact timings.

EngineCore timestamps (events, each batch's `timestamp`) are chosen by hand, so queue,
prefill, decode and inference times and inter-token latencies are exact; TTFT and e2e run
from the arrival time on the wall clock, so they are only bounded.
"""

import time

from tests.helpers.core_requests import core_request
from vjx.engine.llm_engine import register_request
from vjx.engine.messages import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason
from vjx.engine.output_processor import OutputProcessor
from vjx.metrics.stats import IterationStats

QUEUED, SCHEDULED, PREEMPTED = EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED, EngineCoreEventType.PREEMPTED


def _step(processor, outputs, timestamp):
    stats = IterationStats()
    processor.process_outputs(outputs, timestamp, stats)
    return stats


def test_one_request_timings_tokens_and_finish(tokenizer):
    processor = OutputProcessor(tokenizer)
    request = core_request(tokenizer, "a", "Hello world", max_tokens=3, ignore_eos=True)
    request.arrival_time = time.time()
    register_request(processor, request, None)
    num_prompt = len(request.prompt_token_ids)
    # EngineCore sends the prompt's cached token count with every output.
    events = [EngineCoreEvent(QUEUED, 10.0), EngineCoreEvent(SCHEDULED, 10.5)]
    first = _step(processor, [EngineCoreOutput("a", [5], num_cached_tokens=2, events=events)], 11.0)
    assert first.prompt_token_stats.computed == num_prompt - 2 and first.prompt_token_stats.local_cache_hit == 2
    assert first.num_generation_tokens == 1 and first.inter_token_latencies_iter == []
    assert len(first.time_to_first_tokens_iter) == 1 and 0 <= first.time_to_first_tokens_iter[0] < 5
    preempted = [EngineCoreEvent(PREEMPTED, 11.2), EngineCoreEvent(SCHEDULED, 11.3)]
    second = _step(processor, [EngineCoreOutput("a", [6], num_cached_tokens=2, events=preempted)], 11.5)
    assert second.num_preempted_reqs == 1 and second.inter_token_latencies_iter == [0.5]
    assert second.prompt_token_stats.total == 0 and second.time_to_first_tokens_iter == []
    last = _step(processor, [EngineCoreOutput("a", [7], FinishReason.LENGTH, num_cached_tokens=2)], 12.5)
    assert last.inter_token_latencies_iter == [1.0]
    [finished] = last.finished_requests
    assert finished.finish_reason == FinishReason.LENGTH
    assert (finished.num_prompt_tokens, finished.num_cached_tokens) == (num_prompt, 2)
    assert (finished.num_generation_tokens, finished.num_preemptions, finished.max_tokens_param) == (3, 1, 3)
    # Queued 10.0 -> scheduled 10.5 (the first admission) -> first token 11.0 -> last 12.5.
    assert (finished.queued_time, finished.prefill_time, finished.decode_time) == (0.5, 0.5, 1.5)
    assert finished.inference_time == 2.0 and finished.mean_time_per_output_token == 0.75
    assert 0 <= finished.e2e_latency < 5
    assert (last.n_params_iter, last.max_num_generation_tokens_iter) == ([1], [3])


def test_a_stop_string_finishes_with_stop(tokenizer):
    processor = OutputProcessor(tokenizer)
    register_request(processor, core_request(tokenizer, "s", "The", stop=["llo"], max_tokens=8), None)
    stats = _step(processor, [EngineCoreOutput("s", tokenizer.encode("Hello", add_special_tokens=False))], 1.0)
    [finished] = stats.finished_requests
    assert finished.finish_reason == FinishReason.STOP


def test_n_children_count_once_with_their_most_tokens(tokenizer):
    processor = OutputProcessor(tokenizer)
    children = register_request(processor, core_request(tokenizer, "p", "The", n=2, max_tokens=4), None)
    ids = [c.request_id for c in children]
    first = _step(
        processor, [EngineCoreOutput(ids[0], [5, 6, 7], FinishReason.STOP), EngineCoreOutput(ids[1], [5])], 1.0
    )
    assert len(first.finished_requests) == 1 and first.n_params_iter == []
    last = _step(processor, [EngineCoreOutput(ids[1], [6], FinishReason.LENGTH)], 2.0)
    assert (last.n_params_iter, last.max_num_generation_tokens_iter) == ([2], [3])
    assert [f.num_generation_tokens for f in last.finished_requests] == [2]


def test_without_iteration_stats_nothing_is_recorded(tokenizer):
    processor = OutputProcessor(tokenizer)
    register_request(processor, core_request(tokenizer, "a", "The", max_tokens=2), None)
    processor.process_outputs([EngineCoreOutput("a", [5])])
    assert processor.request_states["a"].stats.num_generation_tokens == 0
