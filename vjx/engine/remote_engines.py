"""Data-parallel replicas on other hosts (vLLM's multi-node data parallelism).

The head (`LLM`, or `vjx serve`, with `data_parallel_size_local` below `data_parallel_size`)
runs replicas [0, local) as its own engine processes; each other host runs `vjx serve
--headless --data-parallel-start-rank R --data-parallel-size-local L`, whose replicas
[R, R + L) are engine processes of that host (`run_headless_replicas`) that dial the head at
`data_parallel_address`:

- `data_parallel_rpc_port`: the head's handshake socket (PULL). A replica sends READY (its
  rank, KV blocks, max_model_len and where it bound its input socket) or FAILED.
- the next port: the head's output socket, the one its own engine processes push to.
- the one after: the head's heartbeat server (vjx/distributed/channel.py). A replica pings
  from its READY on; the head declares a replica dead after `HEARTBEAT_TIMEOUT_S` without a
  ping (the front end then raises `EngineDeadError`), a replica ends when the head goes silent.

The head's sockets keep core_proc's rule (only PULL sockets bind, every PUSH connects); a
replica binds its input socket on the interface its host reaches the head through. Each
replica makes its own token and sends it in its handshake: the head takes one handshake per
rank, only while it waits for them (trust on first contact), so, as with vLLM, these ports
must be reachable from the cluster's hosts only. The head's shutdown sends each replica
SHUTDOWN; a headless host returns once all its replicas have ended.
"""

import logging
import multiprocessing
import os
import secrets
import signal
import socket
import time

import zmq

from vjx import process_setup
from vjx.config import ParallelConfig
from vjx.distributed.channel import HEARTBEAT_TIMEOUT_S, HeartbeatServer, replica_identity
from vjx.engine import core_proc, serial
from vjx.engine_args import EngineArgs

logger = logging.getLogger(__name__)

_POLL_MS = 500
_LINGER_MS = 1000


def remote_addresses(parallel_config: ParallelConfig) -> dict[str, str]:
    """The head's three sockets for the replicas of other hosts."""
    host, port = parallel_config.data_parallel_address, parallel_config.data_parallel_rpc_port
    return {name: f"tcp://{host}:{port + i}" for i, name in enumerate(("handshake", "output", "heartbeat"))}


class RemoteEngine:
    """The head's handle on one replica of another host, with `EngineProcess`'s face."""

    def __init__(self, group: "RemoteEngines", token: bytes, ready: serial.EngineReady):
        self.group = group
        self.token = token
        self.data_parallel_rank = ready.data_parallel_rank
        self.identity = replica_identity(ready.data_parallel_rank).decode()
        self.addresses = {"input": ready.input_address}

    def is_alive(self) -> bool:
        return self.group.silent != self.identity

    def exit_description(self) -> str:
        return f"on another host stopped answering for {HEARTBEAT_TIMEOUT_S:.0f} s (it died or its host is unreachable)"

    def shutdown(self) -> None:
        """Tells the replica to end; a replica that is gone anyway costs a linger's wait."""
        sender = self.group.context.socket(zmq.PUSH)
        sender.connect(self.addresses["input"])
        try:
            sender.send_multipart(serial.encode(self.token, serial.SHUTDOWN, None), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # never connected: the replica ends when its heartbeats go unanswered
        sender.close(linger=_LINGER_MS)


class RemoteEngines:
    """The head's side of the replicas [local, data_parallel_size) on other hosts: it binds
    the handshake and heartbeat sockets, and `output_socket` (already bound for the head's own
    engine processes) on the outputs' port too."""

    def __init__(self, context: zmq.Context, parallel_config: ParallelConfig, output_socket: zmq.Socket):
        self.context = context
        self.ranks = range(parallel_config.local_data_parallel_size, parallel_config.data_parallel_size)
        self.addresses = remote_addresses(parallel_config)
        self.handshake = context.socket(zmq.PULL)
        self.handshake.bind(self.addresses["handshake"])
        output_socket.bind(self.addresses["output"])
        self.silent: str | None = None
        self.heartbeats = HeartbeatServer(context, self.addresses["heartbeat"], on_failure=self._on_silence)
        self.drops = serial.DropLog("the handshake socket for other hosts' replicas")

    def _on_silence(self, identity: str) -> None:
        logger.error("Data-parallel %s stopped answering for %.0f s.", identity, HEARTBEAT_TIMEOUT_S)
        self.silent = identity

    def wait_ready(self, timeout_s: float) -> list[tuple[RemoteEngine, serial.EngineReady]]:
        """Each remote replica's handle and handshake, by rank; RuntimeError when one fails to
        start or they are not all up within `timeout_s`."""
        logger.info(
            "Waiting for data-parallel replicas %d to %d from other hosts at %s.",
            self.ranks.start,
            self.ranks.stop - 1,
            self.addresses["handshake"],
        )
        engines: dict[int, tuple[RemoteEngine, serial.EngineReady]] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(engines) < len(self.ranks):
                if time.monotonic() > deadline:
                    missing = sorted(set(self.ranks) - set(engines))
                    raise RuntimeError(f"Data-parallel replicas {missing} did not start within {timeout_s} s.")
                if self.handshake.poll(_POLL_MS):
                    self._take_handshake(engines)
        finally:
            self.handshake.close(linger=0)
        return [engines[rank] for rank in self.ranks]

    def _take_handshake(self, engines: dict) -> None:
        try:
            token, kind, payload = serial.decode_first_contact(self.handshake.recv_multipart(), serial.HANDSHAKE_KINDS)
        except ValueError as e:
            self.drops.drop(e)
            return
        if kind == serial.FAILED:
            raise RuntimeError(f"A data-parallel replica on another host failed to start:\n{payload}")
        rank = payload.data_parallel_rank
        if rank not in self.ranks or rank in engines:
            self.drops.drop(ValueError(f"a handshake of replica {rank}, which is not awaited"))
            return
        engines[rank] = (RemoteEngine(self, token, payload), payload)
        self.heartbeats.watch(replica_identity(rank))

    def shutdown(self) -> None:
        self.heartbeats.stop()
        self.handshake.close(linger=0)


def _address_towards(host: str) -> str:
    """This host's address on the interface that reaches `host` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def run_headless_replicas(engine_args: EngineArgs) -> int:
    """A headless host's replicas: one engine process each, until all have ended; the exit
    code is 0 when each ended at the head's word."""
    parallel_config = engine_args.create_parallel_config()
    addresses = remote_addresses(parallel_config)
    own_address = _address_towards(parallel_config.data_parallel_address)
    first = parallel_config.data_parallel_start_rank
    processes = []
    for rank in range(first, first + parallel_config.local_data_parallel_size):
        engine_addresses = {**addresses, "input": f"tcp://{own_address}:*"}
        args = (
            serial.encode_dataclass(engine_args),
            engine_addresses,
            secrets.token_bytes(32),
            process_setup.compilation_cache_options(),
            os.getpid(),
            core_proc.replica_placement(engine_args, rank),
            addresses["heartbeat"],
        )
        process = multiprocessing.get_context("spawn").Process(
            target=core_proc.run_engine_core, args=args, name=f"VjxEngineCore-DP{rank}"
        )
        process.start()
        processes.append(process)
    # Replicas watch this process: on SIGTERM it exits and they follow within a poll.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
    logger.info("Data-parallel replicas %d to %d dial the head at %s.", first, rank, addresses["handshake"])
    for process in processes:
        process.join()
    return 0 if all(process.exitcode == 0 for process in processes) else 1
