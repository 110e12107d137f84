"""The scheduler's EngineCoreEvents (queued, scheduled, preempted): sent with a request's next
output, in order, on the monotonic clock; the front end turns them into queue and prefill times."""

import time

from tests.helpers.scheduler import make_request, make_scheduler, step
from vjx.engine.messages import EngineCoreEventType

QUEUED, SCHEDULED, PREEMPTED = EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED, EngineCoreEventType.PREEMPTED
A_PROMPT = [10, 11, 12, 13, 14, 15, 16, 17]
B_PROMPT = [20, 21, 22, 23, 24, 25, 26, 27]


def _events(engine_outputs) -> dict[str, list]:
    return {o.request_id: [e.type for e in o.events or []] for o in engine_outputs.outputs}


def test_events_come_once_with_the_next_output():
    start = time.monotonic()
    scheduler = make_scheduler(num_gpu_blocks=5, max_model_len=16, max_num_batched_tokens=16)
    scheduler.add_request(make_request("a", A_PROMPT, max_tokens=4))
    scheduler.add_request(make_request("b", B_PROMPT, max_tokens=4))
    _, engine_outputs = step(scheduler, {"a": [30], "b": [40]})
    assert _events(engine_outputs) == {"a": [QUEUED, SCHEDULED], "b": [QUEUED, SCHEDULED]}
    queued, scheduled = engine_outputs.outputs[0].events
    assert start <= queued.timestamp <= scheduled.timestamp <= engine_outputs.timestamp <= time.monotonic()
    # a needs a third block and none is free: b is preempted, and hears of it when it resumes.
    _, engine_outputs = step(scheduler, {"a": [31]})
    assert _events(engine_outputs) == {"a": []}
    step(scheduler, {"a": [32]})
    step(scheduler, {"a": [33]})
    _, engine_outputs = step(scheduler, {"b": [41]})
    assert _events(engine_outputs) == {"b": [PREEMPTED, SCHEDULED]}
    _, engine_outputs = step(scheduler, {"b": [42]})
    assert engine_outputs.outputs[0].events is None


def test_a_chunked_prefill_keeps_its_events_for_its_first_token():
    scheduler = make_scheduler(max_num_batched_tokens=16, max_model_len=32)
    scheduler.add_request(make_request("a", list(range(10, 30)), max_tokens=2))
    _, engine_outputs = step(scheduler, {})
    assert engine_outputs.outputs == []
    _, engine_outputs = step(scheduler, {"a": [5]})
    assert _events(engine_outputs) == {"a": [QUEUED, SCHEDULED]}
