"""The wire format between the front end and the engine process: msgspec msgpack.

Pickle is used for one thing only: `collective_rpc`, whose callable, arguments and results
are arbitrary Python objects (cloudpickle when installed, so lambdas and closures go too).
Only a holder of the engine's token can send a message that gets unpickled.

A message is three ZeroMQ frames: the engine's token, a one-word kind, a msgpack payload.
Any process of the same user can reach the sockets, so the token (a secret the parent makes
per engine process and hands to the child in its spawn arguments) is what tells our own
messages from injected ones. `decode` raises ValueError for a missing or wrong token, a kind
the socket does not carry, or a payload the typed decoder rejects; receivers drop such a
message through a `DropLog` and keep serving.
"""

import dataclasses
import hmac
import logging
import math
import pickle
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from vjx.core.sched.stats import SchedulerStats
from vjx.engine.messages import EngineCoreOutputs, EngineCoreRequest

# Front end -> engine.
ADD = b"ADD"
ABORT = b"ABORT"
UTILITY = b"UTILITY"
SHUTDOWN = b"SHUTDOWN"
# Engine -> front end.
READY = b"READY"
FAILED = b"FAILED"
OUTPUTS = b"OUTPUTS"
UTILITY_RESULT = b"UTILITY_RESULT"
REQUEST_ERROR = b"REQUEST_ERROR"
DEAD = b"DEAD"

INPUT_KINDS = (ADD, ABORT, UTILITY, SHUTDOWN)
"""What the engine's input socket carries."""
HANDSHAKE_KINDS = (READY, FAILED)
"""What the parent's handshake socket carries."""
OUTPUT_KINDS = (OUTPUTS, UTILITY_RESULT, REQUEST_ERROR, DEAD)
"""What the front end's output socket carries."""

logger = logging.getLogger(__name__)

UTILITY_RESULT_TYPES: dict[str, Any] = {
    "get_stats": SchedulerStats,
    "reset_prefix_cache": bool,
    "sleep": None,
    "wake_up": bool,
    "is_sleeping": bool,
    "profile": None,
    "collective_rpc": bytes,
    "add_lora": bool,
    "remove_lora": bool,
    "pin_lora": bool,
    "list_loras": set[int],
}
"""The utilities the engine process serves, with the type of each one's result
(`collective_rpc`'s is the pickle of its list of results)."""


@dataclasses.dataclass
class UtilityCall:
    call_id: int
    method: str
    args: list[Any] = dataclasses.field(default_factory=list)
    """The method's positional arguments (msgpack values; `collective_rpc` gets one: the
    pickle of its method, args and kwargs)."""


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
    input_address: str
    """Where the child bound its input socket; the parent connects its sender there."""
    data_parallel_rank: int = 0
    """Which replica it is (a head learns it so from the replicas on other hosts)."""


@dataclasses.dataclass
class EngineFailure:
    """Why the busy loop died (the DEAD message)."""

    error: str
    """The exception's type and message."""
    traceback: str
    """For the front end's log only: it holds file paths and internals."""


@dataclasses.dataclass
class RequestError:
    request_id: str
    message: str


_encoder = msgspec.msgpack.Encoder()
_decoders = {
    ADD: msgspec.msgpack.Decoder(EngineCoreRequest),
    ABORT: msgspec.msgpack.Decoder(list[str]),
    UTILITY: msgspec.msgpack.Decoder(UtilityCall),
    SHUTDOWN: msgspec.msgpack.Decoder(None),
    READY: msgspec.msgpack.Decoder(EngineReady),
    FAILED: msgspec.msgpack.Decoder(str),
    OUTPUTS: msgspec.msgpack.Decoder(EngineCoreOutputs),
    UTILITY_RESULT: msgspec.msgpack.Decoder(UtilityResult),
    REQUEST_ERROR: msgspec.msgpack.Decoder(RequestError),
    DEAD: msgspec.msgpack.Decoder(EngineFailure),
}
_result_decoders = {method: msgspec.msgpack.Decoder(kind) for method, kind in UTILITY_RESULT_TYPES.items()}


def encode(token: bytes, kind: bytes, payload: Any) -> list[bytes]:
    return [token, kind, _encoder.encode(payload)]


def decode_first_contact(frames: list[bytes], kinds: Sequence[bytes]) -> tuple[bytes, bytes, Any]:
    """Returns (token, kind, payload) of a handshake from an engine process on another host,
    whose token the receiver learns from it (trust on first contact: the head takes one
    handshake per replica, and only while it waits for them); raises ValueError as `decode`."""
    if len(frames) != 3 or not frames[0]:
        raise ValueError("message must be [token, kind, payload] with a token.")
    return frames[0], *decode(frames, [frames[0]], kinds)


def decode(frames: list[bytes], tokens: Sequence[bytes], kinds: Sequence[bytes]) -> tuple[bytes, Any]:
    """Returns (kind, payload) of a message signed with one of `tokens` whose kind is one of
    `kinds`; raises ValueError for anything else."""
    if len(frames) != 3:
        raise ValueError(f"message must be [token, kind, payload], got {len(frames)} frames.")
    # Every token is compared, in constant time, so the timing tells nothing about them.
    if not any([hmac.compare_digest(frames[0], token) for token in tokens]):
        raise ValueError("message has a missing or wrong token.")
    kind, payload = frames[1], frames[2]
    if kind not in kinds:
        raise ValueError(f"message kind must be one of {sorted(kinds)}, got {kind[:16]!r}.")
    try:
        return kind, _decoders[kind].decode(payload)
    except msgspec.MsgspecError as e:
        raise ValueError(f"bad {kind.decode()} payload: {e}") from e


class DropLog:
    """Warns about the messages a socket drops: the first at once, then at most one count per
    `interval_s`, so a flood of forged frames cannot fill the log."""

    def __init__(self, socket_name: str, interval_s: float = 10.0):
        self.socket_name = socket_name
        self.interval_s = interval_s
        self.num_unlogged = 0
        self.last_logged = -math.inf

    def drop(self, error: ValueError) -> None:
        self.num_unlogged += 1
        now = time.monotonic()
        if now - self.last_logged < self.interval_s:
            return
        if self.num_unlogged == 1:
            logger.warning("Dropped a message on %s: %s", self.socket_name, error)
        else:
            logger.warning(
                "Dropped %d messages on %s in the %.0f s since the last warning; the latest: %s",
                self.num_unlogged,
                self.socket_name,
                now - self.last_logged,
                error,
            )
        self.num_unlogged, self.last_logged = 0, now


def encode_result(value: Any) -> bytes:
    return _encoder.encode(value)


def decode_result(method: str, data: bytes) -> Any:
    return _result_decoders[method].decode(data)


def encode_dataclass(value: Any) -> bytes:
    return _encoder.encode(value)


def decode_dataclass(data: bytes, kind: type) -> Any:
    return msgspec.msgpack.decode(data, type=kind)


def _pickler():
    try:
        import cloudpickle
    except ImportError:
        return pickle
    return cloudpickle


def dumps_rpc(value: Any) -> bytes:
    """Pickles `collective_rpc`'s call or results; ValueError for what cannot be pickled."""
    pickler = _pickler()
    try:
        return pickler.dumps(value)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        hint = "" if pickler is not pickle else " (install cloudpickle to send lambdas and closures)"
        raise ValueError(f"collective_rpc's method and arguments must be picklable{hint}: {e}") from e


def loads_rpc(data: bytes) -> Any:
    return pickle.loads(data)
