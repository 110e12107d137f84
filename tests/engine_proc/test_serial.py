"""The msgspec wire format: dataclasses survive a round trip; malformed, unsigned and
wrongly signed messages are refused, and their warnings are rate-limited."""

import logging

import pytest

from vjx.core.sched.stats import SchedulerStats
from vjx.engine import serial
from vjx.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vjx.engine_args import EngineArgs
from vjx.lora.request import LoRARequest
from vjx.outputs import LogprobsLists
from vjx.sampling_params import RequestOutputKind, SamplingParams

TOKEN = b"t" * 32
OTHER_TOKEN = b"o" * 32


def _request() -> EngineCoreRequest:
    params = SamplingParams(
        temperature=0.5, stop="x", logit_bias={7: 1.5, 3: -2.0}, output_kind=RequestOutputKind.DELTA, bad_words=["no"]
    )
    params.bad_words_token_ids = [[1, 2], [3]]
    lora = LoRARequest("sql", 3, "/adapters/sql")
    return EngineCoreRequest(
        "r0", [1, 2, 3], params, eos_token_id=2, arrival_time=1.5, priority=-1, cache_salt="salt", lora_request=lora
    )


def test_request_round_trip_keeps_init_false_fields_int_keys_and_enums():
    kind, decoded = serial.decode(serial.encode(TOKEN, serial.ADD, _request()), [TOKEN], serial.INPUT_KINDS)
    assert kind == serial.ADD
    assert decoded == _request()
    assert decoded.sampling_params.bad_words_token_ids == [[1, 2], [3]]
    assert decoded.sampling_params.logit_bias == {7: 1.5, 3: -2.0}
    assert decoded.sampling_params.output_kind is RequestOutputKind.DELTA
    assert decoded.lora_request == LoRARequest("sql", 3, "/adapters/sql")


def test_outputs_round_trip():
    logprobs = LogprobsLists([[5, 6]], [[-0.5, -1.0]], [1])
    outputs = EngineCoreOutputs([EngineCoreOutput("r0", [5], FinishReason.STOP, "x", 3, logprobs)], {"r0"})
    frames = serial.encode(OTHER_TOKEN, serial.OUTPUTS, outputs)
    kind, decoded = serial.decode(frames, [TOKEN, OTHER_TOKEN], serial.OUTPUT_KINDS)
    assert (kind, decoded) == (serial.OUTPUTS, outputs)
    assert decoded.outputs[0].finish_reason is FinishReason.STOP


def test_utility_results_and_engine_args_round_trip():
    stats = SchedulerStats(num_running_reqs=1, num_waiting_reqs=2, kv_cache_usage=0.25, num_steps=3)
    assert serial.decode_result("get_stats", serial.encode_result(stats)) == stats
    assert serial.decode_result("reset_prefix_cache", serial.encode_result(True)) is True
    args = EngineArgs(max_model_len=256, multiprocess=True, async_scheduling=False)
    assert serial.decode_dataclass(serial.encode_dataclass(args), EngineArgs) == args


ABORT_PAYLOAD = serial.encode(TOKEN, serial.ABORT, ["a"])[2]


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([TOKEN, b"ADD", b"\x93\x01\x02\x03"], "bad ADD payload"),
        ([TOKEN, b"ADD", b"not msgpack \xc1"], "bad ADD payload"),
        ([TOKEN, b"PICKLE", b"\x80\x04"], "kind must be one of"),
        ([TOKEN, b"OUTPUTS", b"\x80"], "kind must be one of"),
        ([TOKEN, b"ABORT"], "got 2 frames"),
        ([TOKEN, b"ABORT", ABORT_PAYLOAD, b"extra"], "got 4 frames"),
        ([b"ABORT", ABORT_PAYLOAD], "got 2 frames"),
        ([b"", b"ABORT", ABORT_PAYLOAD], "missing or wrong token"),
        ([OTHER_TOKEN, b"ABORT", ABORT_PAYLOAD], "missing or wrong token"),
        ([TOKEN[:-1], b"ABORT", ABORT_PAYLOAD], "missing or wrong token"),
    ],
)
def test_malformed_and_unsigned_messages_are_refused(frames, match):
    with pytest.raises(ValueError, match=match):
        serial.decode(frames, [TOKEN], serial.INPUT_KINDS)


def test_drop_log_warns_once_then_counts(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(serial.time, "monotonic", lambda: now[0])
    drops = serial.DropLog("the test socket", interval_s=10.0)
    with caplog.at_level(logging.WARNING, logger=serial.__name__):
        for _ in range(1000):
            drops.drop(ValueError("message has a missing or wrong token."))
        now[0] += 10.0
        drops.drop(ValueError("bad ADD payload"))
    assert [r.getMessage() for r in caplog.records] == [
        "Dropped a message on the test socket: message has a missing or wrong token.",
        "Dropped 1000 messages on the test socket in the 10 s since the last warning; the latest: bad ADD payload",
    ]
