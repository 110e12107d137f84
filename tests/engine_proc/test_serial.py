"""The msgspec wire format: dataclasses survive a round trip; malformed messages are refused."""

import pytest

from vjx.core.sched.stats import SchedulerStats
from vjx.engine import serial
from vjx.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vjx.engine_args import EngineArgs
from vjx.outputs import LogprobsLists
from vjx.sampling_params import RequestOutputKind, SamplingParams


def _request() -> EngineCoreRequest:
    params = SamplingParams(
        temperature=0.5, stop="x", logit_bias={7: 1.5, 3: -2.0}, output_kind=RequestOutputKind.DELTA, bad_words=["no"]
    )
    params.bad_words_token_ids = [[1, 2], [3]]
    return EngineCoreRequest("r0", [1, 2, 3], params, eos_token_id=2, arrival_time=1.5, priority=-1, cache_salt="salt")


def test_request_round_trip_keeps_init_false_fields_int_keys_and_enums():
    kind, decoded = serial.decode(serial.encode(serial.ADD, _request()))
    assert kind == serial.ADD
    assert decoded == _request()
    assert decoded.sampling_params.bad_words_token_ids == [[1, 2], [3]]
    assert decoded.sampling_params.logit_bias == {7: 1.5, 3: -2.0}
    assert decoded.sampling_params.output_kind is RequestOutputKind.DELTA


def test_outputs_round_trip():
    logprobs = LogprobsLists([[5, 6]], [[-0.5, -1.0]], [1])
    outputs = EngineCoreOutputs([EngineCoreOutput("r0", [5], FinishReason.STOP, "x", 3, logprobs)], {"r0"})
    kind, decoded = serial.decode(serial.encode(serial.OUTPUTS, outputs))
    assert (kind, decoded) == (serial.OUTPUTS, outputs)
    assert decoded.outputs[0].finish_reason is FinishReason.STOP


def test_utility_results_and_engine_args_round_trip():
    stats = SchedulerStats(num_running_reqs=1, num_waiting_reqs=2, kv_cache_usage=0.25, num_steps=3)
    assert serial.decode_result("get_stats", serial.encode_result(stats)) == stats
    assert serial.decode_result("reset_prefix_cache", serial.encode_result(True)) is True
    args = EngineArgs(max_model_len=256, multiprocess=True, async_scheduling=False)
    assert serial.decode_dataclass(serial.encode_dataclass(args), EngineArgs) == args


@pytest.mark.parametrize(
    "frames",
    [
        [b"ADD", b"\x93\x01\x02\x03"],
        [b"ADD", b"not msgpack \xc1"],
        [b"PICKLE", b"\x80\x04"],
        [b"ABORT"],
        [b"ABORT", serial.encode(serial.ABORT, ["a"])[1], b"extra"],
    ],
)
def test_malformed_messages_are_refused(frames):
    with pytest.raises(ValueError):
        serial.decode(frames)
