"""The UTILITY messages `LLM`'s engine methods send: arguments, results, pickled RPCs."""

import pytest

from tests.helpers.worker_rpc import worker_summary
from vjx.engine import serial

TOKEN = b"t" * 32


def test_utility_call_carries_its_arguments():
    call = serial.UtilityCall(3, "sleep", [2, "abort"])
    kind, decoded = serial.decode(serial.encode(TOKEN, serial.UTILITY, call), [TOKEN], serial.INPUT_KINDS)
    assert (kind, decoded) == (serial.UTILITY, call)
    legacy = serial.encode(TOKEN, serial.UTILITY, {"call_id": 4, "method": "get_stats"})
    assert serial.decode(legacy, [TOKEN], serial.INPUT_KINDS)[1].args == []


@pytest.mark.parametrize(("method", "value"), [("sleep", None), ("wake_up", True), ("collective_rpc", b"\x80")])
def test_results_round_trip(method, value):
    assert serial.decode_result(method, serial.encode_result(value)) == value


def test_rpc_pickles_module_functions():
    call = (worker_summary, ("a",), {"scale": 2})
    assert serial.loads_rpc(serial.dumps_rpc(call)) == call


def test_rpc_refuses_what_cannot_be_pickled():
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="must be picklable"):
            serial.dumps_rpc(lambda worker: 1)
    else:
        assert serial.loads_rpc(serial.dumps_rpc(lambda worker: 1))(None) == 1
