"""The wire format between the front end and the engine process: msgspec msgpack, no pickle.

A message is a list of ZeroMQ frames: a one-word kind, then msgpack payloads. The typed
decoders reject anything that is not the expected shape, so a malformed message raises
`msgspec.ValidationError` / `msgspec.DecodeError` instead of reaching the engine.
"""

import dataclasses
from typing import Any

import msgspec

from vjx.core.sched.stats import SchedulerStats
from vjx.engine.messages import EngineCoreOutputs, EngineCoreRequest

# Front end -> engine.
ADD = b"ADD"
ABORT = b"ABORT"
UTILITY = b"UTILITY"
# Engine -> front end.
READY = b"READY"
FAILED = b"FAILED"
OUTPUTS = b"OUTPUTS"
UTILITY_RESULT = b"UTILITY_RESULT"
REQUEST_ERROR = b"REQUEST_ERROR"
DEAD = b"DEAD"

UTILITY_RESULT_TYPES: dict[str, Any] = {"get_stats": SchedulerStats, "reset_prefix_cache": bool}
"""The utilities the engine process serves, with the type of each one's result."""


@dataclasses.dataclass
class UtilityCall:
    call_id: int
    method: str


@dataclasses.dataclass
class UtilityResult:
    call_id: int
    failure: str | None = None
    """The error's message when the call raised; then `result` is None."""
    result: bytes = b""
    """The msgpack of the method's return value."""


@dataclasses.dataclass
class EngineReady:
    """The engine process's handshake: what the front end must know before serving."""

    num_gpu_blocks: int
    max_model_len: int


@dataclasses.dataclass
class RequestError:
    request_id: str
    message: str


_encoder = msgspec.msgpack.Encoder()
_decoders = {
    ADD: msgspec.msgpack.Decoder(EngineCoreRequest),
    ABORT: msgspec.msgpack.Decoder(list[str]),
    UTILITY: msgspec.msgpack.Decoder(UtilityCall),
    READY: msgspec.msgpack.Decoder(EngineReady),
    FAILED: msgspec.msgpack.Decoder(str),
    OUTPUTS: msgspec.msgpack.Decoder(EngineCoreOutputs),
    UTILITY_RESULT: msgspec.msgpack.Decoder(UtilityResult),
    REQUEST_ERROR: msgspec.msgpack.Decoder(RequestError),
    DEAD: msgspec.msgpack.Decoder(str),
}
_result_decoders = {method: msgspec.msgpack.Decoder(kind) for method, kind in UTILITY_RESULT_TYPES.items()}


def encode(kind: bytes, payload: Any) -> list[bytes]:
    return [kind, _encoder.encode(payload)]


def decode(frames: list[bytes]) -> tuple[bytes, Any]:
    """Returns (kind, payload); raises ValueError for an unknown kind or a bad payload."""
    if len(frames) != 2 or frames[0] not in _decoders:
        raise ValueError(
            f"message must be [kind, payload] with kind in {sorted(_decoders)}, "
            f"got {len(frames)} frames starting {frames[0][:16]!r}."
        )
    try:
        return frames[0], _decoders[frames[0]].decode(frames[1])
    except msgspec.MsgspecError as e:
        raise ValueError(f"bad {frames[0].decode()} payload: {e}") from e


def encode_result(value: Any) -> bytes:
    return _encoder.encode(value)


def decode_result(method: str, data: bytes) -> Any:
    return _result_decoders[method].decode(data)


def encode_dataclass(value: Any) -> bytes:
    return _encoder.encode(value)


def decode_dataclass(data: bytes, kind: type) -> Any:
    return msgspec.msgpack.decode(data, type=kind)
