"""EngineCoreProc: EngineCore in its own process, so the device stays busy while the front
end tokenizes, detokenizes and serves HTTP.

The child runs a busy loop (take inputs, step, queue outputs) with two socket threads: one
decodes incoming messages into a queue, one sends queued outputs. The busy loop never
touches a socket, so a slow front end never stalls a step. `EngineProcess` is the parent's
handle: it spawns the child and waits for its handshake.

Sockets live in a private temp dir (ipc://) or on 127.0.0.1. Only PULL sockets bind: the
parent's handshake and output sockets, the child's input socket (its address comes back in
the handshake); every PUSH connects. A bound PUSH would hand its messages to any peer that
connects a PULL to it, so this way no foreign process can receive what a socket of ours
sends; what a foreign process sends is dropped for lacking the engine's token (see `serial`).

With data parallelism there is one child per replica, and each uses only its own device
group. On GPUs the child hides the other devices before JAX starts (`jax_cuda_visible_devices`),
so it neither sees nor reserves memory on another replica's GPUs, and runs as a single
replica on what is left; elsewhere (CPU) it picks its group by index.
"""

import dataclasses
import logging
import multiprocessing
import os
import queue
import secrets
import shutil
import signal
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable

import jax
import zmq

from vjx import process_setup
from vjx.config import VjxConfig
from vjx.distributed import jax_distributed
from vjx.distributed.channel import HeartbeatClient, replica_identity
from vjx.engine import serial
from vjx.engine.core import EngineCore
from vjx.engine_args import EngineArgs
from vjx.lora.request import LoRARequest
from vjx.sharding.mesh import device_groups

logger = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
_SHUTDOWN_TIMEOUT_S = 5.0
_LINGER_MS = 2000
_TRANSPORTS = ("ipc", "tcp")


def _exit_after(shutdowns: list[Callable[[], None]], code: int) -> None:
    """Runs `shutdowns` (the executor's: its other ranks leave first), then ends the process."""
    for shutdown in shutdowns:
        shutdown()
    os._exit(code)


def _watch_parent(parent_pid: int, shutdowns: list[Callable[[], None]]) -> None:
    """Ends the child when its parent is gone (even killed), so no engine outlives it."""
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    _exit_after(shutdowns, 1)


@dataclasses.dataclass(frozen=True)
class ReplicaPlacement:
    """Which devices one engine process uses."""

    data_parallel_rank: int = 0
    visible_devices: str | None = None
    """Comma-separated GPU ids the process may see (its replica's group); None: all devices,
    the group chosen by rank."""


def replica_placement(engine_args: EngineArgs, rank: int) -> ReplicaPlacement:
    """Replica `rank`'s devices: on GPUs (with several replicas) the ids of its group."""
    if engine_args.data_parallel_size == 1 or jax.default_backend() != "gpu":
        return ReplicaPlacement(rank)
    parallel_config = engine_args.create_parallel_config()
    group = device_groups(parallel_config)[rank - parallel_config.data_parallel_start_rank]
    return ReplicaPlacement(rank, ",".join(str(device.id) for device in group))


def _replica_config(engine_args: EngineArgs, placement: ReplicaPlacement) -> VjxConfig:
    """The child's config: one replica on the GPUs it sees (the others are hidden), or on CPU
    the group of its rank."""
    if placement.visible_devices is not None:
        one_replica = dict(data_parallel_size=1, data_parallel_size_local=None, data_parallel_start_rank=None)
        return dataclasses.replace(engine_args, **one_replica).create_engine_config()
    return engine_args.create_engine_config().for_data_parallel_rank(placement.data_parallel_rank)


def run_engine_core(
    engine_args_bytes: bytes,
    addresses: dict[str, str],
    token: bytes,
    cache_options: dict,
    parent_pid: int,
    placement: ReplicaPlacement = ReplicaPlacement(),
    heartbeat_address: str | None = None,
) -> None:
    """The child's entry point: set up the process, build EngineCore, report readiness (or
    the error), serve. `token` signs every message; it comes in the spawn arguments, never
    the command line (which every user can read) or the environment (which children inherit).
    A replica on another host than the front end's pings the head's `heartbeat_address` from
    its READY on (vjx/engine/remote_engines.py)."""
    shutdowns: list[Callable[[], None]] = []
    threading.Thread(target=_watch_parent, args=(parent_pid, shutdowns), daemon=True, name="vjx-parent-watch").start()
    context = zmq.Context()
    handshake = context.socket(zmq.PUSH)
    handshake.connect(addresses["handshake"])
    try:
        process_setup.setup_engine_process(cache_options, placement.visible_devices)
        engine_args = serial.decode_dataclass(engine_args_bytes, EngineArgs)
        if engine_args.distributed_executor_backend == "ray" and engine_args.nnodes > 1:
            from vjx.executor.ray_utils import initialize_ray_cluster

            engine_args = initialize_ray_cluster(engine_args)
        jax_distributed.initialize(engine_args.create_parallel_config())
        config = _replica_config(engine_args, placement)
        engine_core = EngineCore(config)
        # The parent stops this process with SIGTERM: the executor first tells its other ranks.
        shutdowns.append(engine_core.model_executor.shutdown)
        signal.signal(signal.SIGTERM, lambda *_: _exit_after(shutdowns, 0))
        proc = EngineCoreProc(engine_core, context, addresses, token, on_shutdown=lambda: _exit_after(shutdowns, 0))
    except Exception:
        failure = f"Replica {placement.data_parallel_rank}: {traceback.format_exc()}"
        handshake.send_multipart(serial.encode(token, serial.FAILED, failure))
        handshake.close(linger=_LINGER_MS)
        return
    if heartbeat_address is not None:
        HeartbeatClient(context, heartbeat_address, replica_identity(placement.data_parallel_rank))
    rank, max_model_len = placement.data_parallel_rank, config.scheduler_config.max_model_len
    ready = serial.EngineReady(engine_core.num_gpu_blocks, max_model_len, proc.input_address, rank)
    handshake.send_multipart(serial.encode(token, serial.READY, ready))
    handshake.close(linger=_LINGER_MS)
    proc.run_busy_loop()


class EngineCoreProc:
    """The child's busy loop around one EngineCore.

    It binds its input socket at `addresses["input"]` (`input_address` is where it ended up,
    the port for tcp) and connects its output socket to the parent's. SHUTDOWN (which a head
    sends its replicas on other hosts) runs `on_shutdown`."""

    def __init__(
        self,
        engine_core: EngineCore,
        context: zmq.Context,
        addresses: dict[str, str],
        token: bytes,
        on_shutdown: Callable[[], None] = lambda: None,
    ):
        self.engine_core = engine_core
        self.token = token
        self.on_shutdown = on_shutdown
        self.input_queue: queue.Queue = queue.Queue()
        self.output_queue: queue.Queue = queue.Queue()
        self.input_drops = serial.DropLog("the engine's input socket")
        input_socket = context.socket(zmq.PULL)
        input_socket.bind(addresses["input"])
        self.input_address = input_socket.getsockopt_string(zmq.LAST_ENDPOINT)
        output_socket = context.socket(zmq.PUSH)
        output_socket.connect(addresses["output"])
        threading.Thread(
            target=self._receive_inputs, args=(input_socket,), daemon=True, name="vjx-engine-input"
        ).start()
        self.output_thread = threading.Thread(
            target=self._send_outputs, args=(output_socket,), daemon=True, name="vjx-engine-output"
        )
        self.output_thread.start()

    def _receive_inputs(self, socket: zmq.Socket) -> None:
        while True:
            frames = socket.recv_multipart()
            try:
                self.input_queue.put(serial.decode(frames, [self.token], serial.INPUT_KINDS))
            except ValueError as e:
                # A forged or malformed message is dropped; the engine keeps serving everyone else.
                self.input_drops.drop(e)

    def _send_outputs(self, socket: zmq.Socket) -> None:
        while (frames := self.output_queue.get()) is not None:
            socket.send_multipart(frames)
        socket.close(linger=_LINGER_MS)

    def run_busy_loop(self) -> None:
        """Steps while there is work, sleeps on the input queue while there is none."""
        try:
            while True:
                self._process_input_queue()
                outputs = self.engine_core.step_fn()
                if outputs.outputs or outputs.finished_requests:
                    self._put_output(serial.OUTPUTS, outputs)
        except Exception as e:
            logger.exception("EngineCore failed; the engine process exits.")
            self._put_output(serial.DEAD, serial.EngineFailure(f"{type(e).__name__}: {e}", traceback.format_exc()))
            self.output_queue.put(None)
            self.output_thread.join(_SHUTDOWN_TIMEOUT_S)
            raise

    def _put_output(self, kind: bytes, payload) -> None:
        self.output_queue.put(serial.encode(self.token, kind, payload))

    def _process_input_queue(self) -> None:
        if not self.engine_core.has_work():
            self._handle(*self.input_queue.get())
        while not self.input_queue.empty():
            self._handle(*self.input_queue.get_nowait())

    def _handle(self, kind: bytes, payload) -> None:
        if kind == serial.ADD:
            try:
                self.engine_core.add_request(payload)
            except Exception as e:
                # The request fails alone; the others keep running.
                error = serial.RequestError(payload.request_id, f"{type(e).__name__}: {e}")
                self._put_output(serial.REQUEST_ERROR, error)
        elif kind == serial.ABORT:
            self.engine_core.abort_requests(payload)
        elif kind == serial.SHUTDOWN:
            self.on_shutdown()
        else:
            self._put_output(serial.UTILITY_RESULT, self._call_utility(payload))

    def _call_utility(self, call: serial.UtilityCall) -> serial.UtilityResult:
        """Runs a utility; its error (a bad argument, a failing worker method) goes back to
        the caller as the result's `failure`, and the engine keeps serving."""
        if call.method not in serial.UTILITY_RESULT_TYPES:
            return serial.UtilityResult(
                call.call_id,
                failure=f"method must be one of {sorted(serial.UTILITY_RESULT_TYPES)}, got {call.method!r}.",
            )
        try:
            result = self._run_utility(call.method, call.args)
        except Exception as e:
            logger.exception("Utility %s failed in the engine process.", call.method)
            return serial.UtilityResult(call.call_id, failure=f"{type(e).__name__}: {e}")
        return serial.UtilityResult(call.call_id, result=serial.encode_result(result))

    def _run_utility(self, method: str, args: list):
        core = self.engine_core
        if method == "get_stats":
            return core.make_stats()
        if method == "add_lora":
            return core.add_lora(LoRARequest(**args[0]))
        if method == "collective_rpc":
            rpc_method, rpc_args, rpc_kwargs = serial.loads_rpc(args[0])
            return serial.dumps_rpc(core.collective_rpc(rpc_method, None, rpc_args, rpc_kwargs))
        return getattr(core, method)(*args)


def _stop(process: multiprocessing.process.BaseProcess, socket_dir: str) -> None:
    if process.is_alive():
        process.terminate()
        process.join(_SHUTDOWN_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join(_SHUTDOWN_TIMEOUT_S)
    shutil.rmtree(socket_dir, ignore_errors=True)


class EngineProcess:
    """The parent's handle on the engine process: addresses, token, the child, and its reaping.

    With `transport="ipc"` the sockets live in a private temp dir (mode 0700), so no TCP port
    listens; `"tcp"` binds ports on 127.0.0.1 only. `token` is this child's secret: it signs
    every message between the two. The child is a daemon and a finalizer stops it at
    shutdown or interpreter exit.
    """

    def __init__(self, engine_args: EngineArgs, transport: str = "ipc", data_parallel_rank: int = 0):
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport must be one of {_TRANSPORTS}, got {transport!r}.")
        self.socket_dir = tempfile.mkdtemp(prefix="vjx-engine-")
        self.addresses = {
            name: f"ipc://{self.socket_dir}/{name}" if transport == "ipc" else "tcp://127.0.0.1:*"
            for name in ("handshake", "input", "output")
        }
        self.token = secrets.token_bytes(32)
        self.handshake_drops = serial.DropLog("the handshake socket")
        self.engine_args = engine_args
        self.data_parallel_rank = data_parallel_rank
        self.process: multiprocessing.process.BaseProcess | None = None
        self._finalizer = None

    def bind(self, socket: zmq.Socket, name: str) -> None:
        """Binds the parent's end of socket `name`, then records the address the child dials."""
        socket.bind(self.addresses[name])
        self.addresses[name] = socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def start(self, context: zmq.Context, start_timeout_s: float) -> serial.EngineReady:
        """Spawns the child and returns its handshake; raises RuntimeError with the child's error."""
        return self.wait_ready(self.spawn(context), start_timeout_s)

    def spawn(self, context: zmq.Context) -> zmq.Socket:
        """Starts the child; returns the socket its handshake arrives on (for `wait_ready`)."""
        handshake = context.socket(zmq.PULL)
        self.bind(handshake, "handshake")
        placement = replica_placement(self.engine_args, self.data_parallel_rank)
        args = (
            serial.encode_dataclass(self.engine_args),
            self.addresses,
            self.token,
            process_setup.compilation_cache_options(),
            os.getpid(),
            placement,
        )
        self.process = multiprocessing.get_context("spawn").Process(
            target=run_engine_core, args=args, daemon=True, name="VjxEngineCore"
        )
        self.process.start()
        self._finalizer = weakref.finalize(self, _stop, self.process, self.socket_dir)
        return handshake

    def wait_ready(self, handshake: zmq.Socket, start_timeout_s: float) -> serial.EngineReady:
        """The child's handshake (closing `handshake`); raises RuntimeError with its error.

        On READY, `addresses["input"]` becomes the address the child bound."""
        try:
            kind, payload = self._wait_handshake(handshake, start_timeout_s)
        finally:
            handshake.close(linger=0)
        if kind == serial.FAILED:
            self.shutdown()
            raise RuntimeError(f"Engine process failed to start:\n{payload}")
        self.addresses["input"] = payload.input_address
        return payload

    def _wait_handshake(self, socket: zmq.Socket, timeout_s: float) -> tuple[bytes, object]:
        """The child's READY or FAILED; forged messages are dropped and do not end the wait.
        The child and the deadline are checked before every read, so a flood cannot hide
        the child's exit."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.process.is_alive():
                self.shutdown()
                raise RuntimeError(f"Engine process exited during start-up (exit code {self.process.exitcode}).")
            if time.monotonic() > deadline:
                self.shutdown()
                raise RuntimeError(f"Engine process did not start within {timeout_s} s.")
            if not socket.poll(int(_PARENT_POLL_S * 1000)):
                continue
            try:
                return serial.decode(socket.recv_multipart(), [self.token], serial.HANDSHAKE_KINDS)
            except ValueError as e:
                self.handshake_drops.drop(e)

    def is_alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def exit_description(self) -> str:
        return f"exited (exit code {self.process.exitcode})"

    def shutdown(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        else:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def start_engines(
    engines: list[EngineProcess], context: zmq.Context, start_timeout_s: float
) -> list[serial.EngineReady]:
    """Spawns every replica's process first, so they load and compile side by side, then
    waits for each handshake; on a failure the others are stopped too."""
    handshakes = [engine.spawn(context) for engine in engines]
    try:
        return [engine.wait_ready(handshake, start_timeout_s) for engine, handshake in zip(engines, handshakes)]
    except BaseException:
        for engine, handshake in zip(engines, handshakes):
            handshake.close(linger=0)
            engine.shutdown()
        raise
