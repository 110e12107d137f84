"""The control channel of an engine over several processes: rank 0 to the other ranks.

Two ZeroMQ ROUTER sockets bind on rank 0's `master_addr`, on the two ports after JAX's
coordinator (`master_port + 1`, `master_port + 2`); each other rank connects a DEALER to
each, named by its rank:

- control: rank 0 sends every worker call (the config at start, each step's
  `SchedulerOutput`, each collect, each `collective_rpc`) as a pickle, in one order, so every
  rank runs the same programs in the same order; a rank answers only the calls that return a
  value, in msgpack (rank 0 never unpickles what comes from the network).
- heartbeat: each rank pings every `HEARTBEAT_INTERVAL_S`, rank 0 answers. A side that hears
  nothing for `HEARTBEAT_TIMEOUT_S` declares the other dead: on rank 0 that ends the engine
  (the front end then raises `EngineDeadError`), on another rank it ends that process. A
  separate socket and thread, because a rank's main thread may sit in a collective that a
  dead peer never joins. The same two classes watch data-parallel replicas on other hosts
  (vjx/engine/remote_engines.py).
"""

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

import msgspec
import zmq

from vjx.config import ParallelConfig

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 5.0
STARTUP_GRACE_S = 120.0
"""How long a side waits for the other's first ping or pong (the ranks start in any order)."""
_PING, _PONG = b"ping", b"pong"


def free_ports(host: str = "127.0.0.1") -> int:
    """A port p on `host` with p, p + 1 and p + 2 free: JAX's coordinator and this channel."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port + 2 < 65536 and all(_is_free(host, port + i) for i in (1, 2)):
            return port
    raise RuntimeError(f"no three consecutive free ports on {host}")


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def control_address(parallel_config: ParallelConfig) -> str:
    return f"tcp://{parallel_config.master_addr}:{parallel_config.master_port + 1}"


def heartbeat_address(parallel_config: ParallelConfig) -> str:
    return f"tcp://{parallel_config.master_addr}:{parallel_config.master_port + 2}"


def rank_identity(rank: int) -> bytes:
    return f"rank{rank}".encode()


def replica_identity(data_parallel_rank: int) -> bytes:
    """A data-parallel replica's name on its head's heartbeat socket."""
    return f"replica {data_parallel_rank}".encode()


def encode_reply(rank: int, result=None, error: str | None = None) -> bytes:
    """A rank's answer; a result msgpack cannot carry becomes an error naming its type."""
    try:
        return msgspec.msgpack.encode({"rank": rank, "result": result, "error": error})
    except TypeError:
        message = f"its result, a {type(result).__name__}, has no msgpack form"
        return msgspec.msgpack.encode({"rank": rank, "result": None, "error": message})


def decode_reply(frame: bytes) -> dict:
    return msgspec.msgpack.decode(frame)


def _die(message: str) -> None:
    """Ends the process at once: its main thread may be stuck in a collective."""
    logger.error("%s", message)
    os._exit(1)


class HeartbeatServer:
    """The watching side: answers every ping at `address` and watches that each identity in
    `watched` (and each one `watch` adds later) keeps pinging; `on_failure` gets the first
    one that goes silent, by name."""

    def __init__(
        self,
        context: zmq.Context,
        address: str,
        watched: Iterable[bytes] = (),
        on_failure: Callable[[str], None] = _die,
    ):
        self.socket = context.socket(zmq.ROUTER)
        self.socket.bind(address)
        self.lock = threading.Lock()
        # Until its first ping, an identity counts as seen STARTUP_GRACE_S from now.
        grace = time.monotonic() + STARTUP_GRACE_S - HEARTBEAT_TIMEOUT_S
        self.last_seen = {identity: grace for identity in watched}
        self.on_failure = on_failure
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="vjx-heartbeat")
        self.thread.start()

    def watch(self, identity: bytes) -> None:
        """Watches `identity` from now on (a peer that has just said it is ready)."""
        with self.lock:
            self.last_seen[identity] = time.monotonic()

    def _run(self) -> None:
        while not self.stopped.is_set():
            if self.socket.poll(int(HEARTBEAT_INTERVAL_S * 1000)):
                identity, message = self.socket.recv_multipart()
                if message == _PING:
                    with self.lock:
                        if identity in self.last_seen:
                            self.last_seen[identity] = time.monotonic()
                    self.socket.send_multipart([identity, _PONG])
            with self.lock:
                silent = [i for i, seen in self.last_seen.items() if time.monotonic() - seen > HEARTBEAT_TIMEOUT_S]
            if silent and not self.stopped.is_set():
                self.stopped.set()
                self.on_failure(silent[0].decode())
        self.socket.close(linger=0)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


class HeartbeatClient:
    """The watched side: pings `address` as `identity`; `on_failure` runs when the server
    stops answering (by default this process ends)."""

    def __init__(self, context: zmq.Context, address: str, identity: bytes, on_failure: Callable[[str], None] = _die):
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, identity)
        self.socket.connect(address)
        self.on_failure = on_failure
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="vjx-heartbeat")
        self.thread.start()

    def _run(self) -> None:
        # The server binds its end once its engine starts building: the first pong may take a while.
        last_pong = time.monotonic() + STARTUP_GRACE_S - HEARTBEAT_TIMEOUT_S
        while not self.stopped.is_set():
            try:
                self.socket.send(_PING, zmq.NOBLOCK)
            except zmq.Again:
                pass  # not connected (yet, or any more): the missing pongs tell
            deadline = time.monotonic() + HEARTBEAT_INTERVAL_S
            while (left := deadline - time.monotonic()) > 0:
                if self.socket.poll(int(left * 1000)) and self.socket.recv() == _PONG:
                    last_pong = time.monotonic()
            if time.monotonic() - last_pong > HEARTBEAT_TIMEOUT_S and not self.stopped.is_set():
                self.stopped.set()
                self.on_failure(f"the head stopped answering for {HEARTBEAT_TIMEOUT_S:.0f} s; this process ends.")
        self.socket.close(linger=0)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def rank_heartbeat_server(context: zmq.Context, parallel_config: ParallelConfig) -> HeartbeatServer:
    """Rank 0's heartbeat server, watching ranks 1 to nnodes - 1 (their death ends this process)."""
    nnodes = parallel_config.nnodes

    def die(identity: str) -> None:
        _die(
            f"{identity} of {nnodes} processes stopped answering for {HEARTBEAT_TIMEOUT_S:.0f} s "
            "(its process died or its host is unreachable); the engine stops."
        )

    identities = [rank_identity(rank) for rank in range(1, nnodes)]
    return HeartbeatServer(context, heartbeat_address(parallel_config), identities, die)


def rank_heartbeat_client(context: zmq.Context, parallel_config: ParallelConfig) -> HeartbeatClient:
    """A rank's heartbeat client: it ends this process when rank 0 goes silent."""
    return HeartbeatClient(context, heartbeat_address(parallel_config), rank_identity(parallel_config.node_rank))
