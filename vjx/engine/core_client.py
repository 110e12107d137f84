"""EngineCoreClient: how the front end reaches EngineCore.

`InprocClient` calls it in this process. `SyncMPClient` (for `LLM`) and `AsyncMPClient` (for
`AsyncLLM`) talk to an `EngineCoreProc` in a child process over ZeroMQ; pyzmq and msgspec
are imported only when one of them is built, so vjx runs without them in-process.

With `data_parallel_size` > 1 every client fronts that many independent engine replicas
(each with its own devices, scheduler and KV pool): in this process for `InprocClient`, one
child process each for the multiprocess clients. A `LoadBalancer` sends each new request to
the replica with the fewest unfinished requests and routes its aborts to the same replica;
stats and utilities are combined over the replicas.
"""

import asyncio
import collections
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from vjx.config import VjxConfig
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.core import EngineCore
from vjx.engine.exceptions import EngineDeadError, EngineRequestError
from vjx.engine.messages import EngineCoreOutputs, EngineCoreRequest
from vjx.engine_args import EngineArgs

logger = logging.getLogger(__name__)

_POLL_MS = 100
_MAX_REASON_CHARS = 200
START_TIMEOUT_S = 1800.0
"""How long the engine process may take to load and compile before the client gives up."""


def merge_stats(stats: list[SchedulerStats]) -> SchedulerStats:
    """The replicas' stats as one engine's: counts add up, KV cache usage, MBU and MFU are
    means (every replica has a pool and devices of its own), the sleep level the deepest any
    replica is in."""
    means = ("kv_cache_usage", "mbu", "mfu")
    counts = [f.name for f in dataclasses.fields(SchedulerStats) if f.name not in ("sleep_level", *means)]
    total = {name: sum(getattr(s, name) for s in stats) for name in counts}
    for name in means:
        values = [getattr(s, name) for s in stats if getattr(s, name) is not None]
        total[name] = sum(values) / len(values) if values else None
    total["sleep_level"] = max((s.sleep_level for s in stats if s.sleep_level is not None), default=None)
    return SchedulerStats(**total)


_COMBINE_RESULTS = {
    "get_stats": merge_stats,
    "reset_prefix_cache": all,
    "wake_up": all,
    "is_sleeping": any,
    "collective_rpc": lambda results: [result for replica in results for result in replica],
    "add_lora": all,
    "remove_lora": any,
    "pin_lora": all,
    "list_loras": lambda results: set().union(*results),
}
"""How the replicas' results of a utility become one; other utilities give replica 0's."""


def combine_results(method: str, results: list):
    return _COMBINE_RESULTS.get(method, lambda r: r[0])(results)


class LoadBalancer:
    """Which replica runs each unfinished request; a new request goes to the replica with the
    fewest unfinished requests (the lowest rank on a tie)."""

    def __init__(self, num_replicas: int):
        self.num_unfinished = [0] * num_replicas
        self.replica_of: dict[str, int] = {}

    def assign(self, request_id: str) -> int:
        rank = min(range(len(self.num_unfinished)), key=self.num_unfinished.__getitem__)
        self.replica_of[request_id] = rank
        self.num_unfinished[rank] += 1
        return rank

    def release(self, request_ids: list[str]) -> dict[int, list[str]]:
        """Forgets finished or aborted requests; returns them by the replica that runs them.

        An id it does not know (a request that finished meanwhile) goes to every replica,
        where aborting it is a no-op."""
        by_rank: dict[int, list[str]] = collections.defaultdict(list)
        for request_id in request_ids:
            rank = self.replica_of.pop(request_id, None)
            if rank is None:
                for ids in (by_rank[r] for r in range(len(self.num_unfinished))):
                    ids.append(request_id)
                continue
            self.num_unfinished[rank] -= 1
            by_rank[rank].append(request_id)
        return by_rank

    def note_outputs(self, outputs: EngineCoreOutputs) -> None:
        self.release([o.request_id for o in outputs.outputs if o.finished])


class InprocClient:
    """Calls EngineCore directly; `get_output()` runs one step of every replica.

    `engine_core` is replica 0 (the only one without data parallelism)."""

    def __init__(self, config: VjxConfig):
        num_replicas = config.parallel_config.data_parallel_size
        self.engine_cores = [EngineCore(config.for_data_parallel_rank(rank)) for rank in range(num_replicas)]
        self.engine_core = self.engine_cores[0]
        self.balancer = LoadBalancer(num_replicas)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_cores[self.balancer.assign(request.request_id)].add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        for rank, ids in self.balancer.release(request_ids).items():
            self.engine_cores[rank].abort_requests(ids)

    def make_stats(self) -> SchedulerStats:
        return merge_stats([core.make_stats() for core in self.engine_cores])

    def reset_prefix_cache(self) -> bool:
        """Resets every replica's cache (none is skipped when one fails); True if all did."""
        is_reset = [core.reset_prefix_cache() for core in self.engine_cores]
        return all(is_reset)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        for core in self.engine_cores:
            core.sleep(level, mode)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        return all([core.wake_up(tags) for core in self.engine_cores])

    def is_sleeping(self) -> bool:
        return any(core.is_sleeping() for core in self.engine_cores)

    def profile(self, is_start: bool = True, trace_dir: str | None = None) -> None:
        """One trace covers this process, so every replica in it: replica 0 runs it."""
        self.engine_core.profile(is_start, trace_dir)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Every replica's workers' results, replica by replica."""
        return [r for core in self.engine_cores for r in core.collective_rpc(method, timeout, args, kwargs)]

    def call_utility(self, method: str, *args):
        """`method(*args)` on every replica's EngineCore, the results combined."""
        return combine_results(method, [getattr(core, method)(*args) for core in self.engine_cores])

    def get_output(self) -> EngineCoreOutputs:
        outputs = EngineCoreOutputs()
        for core in self.engine_cores:
            step = core.step_fn()
            outputs.outputs.extend(step.outputs)
            outputs.finished_requests |= step.finished_requests
        self.balancer.note_outputs(outputs)
        return outputs

    def shutdown(self) -> None:
        """Shuts every replica's EngineCore down (idempotent)."""
        for core in self.engine_cores:
            core.shutdown()


def dead_reason(error: str) -> str:
    """What `EngineDeadError` says about an engine crash: the first line of "Type: message",
    cut to 200 characters. Its text reaches unauthenticated `/health` callers, so the
    traceback (file paths, internals) goes to the log only."""
    lines = error.strip().splitlines() or ["unknown error"]
    line = lines[0]
    if len(line) > _MAX_REASON_CHARS:
        line = line[: _MAX_REASON_CHARS - 3] + "..."
    return f"EngineCore failed: {line}"


class MPClient:
    """The sockets and the engine processes both multiprocess clients share.

    One engine process per data-parallel replica, each with its own input socket (bound by
    the child; ours connects once the child is ready); all of them push to one output socket
    that we bind. Each replica signs its messages with its own token, and the output socket
    accepts any of them. Sends go through a plain socket and never block on a dead engine:
    each waits for room in short polls and checks that the children still run. `transport`
    is "ipc" (a private temp dir) or "tcp" (127.0.0.1 only). `engine`, `ready` and
    `input_socket` are replica 0's. Replicas on other hosts (`data_parallel_size_local` below
    `data_parallel_size`) dial in over tcp and are watched by heartbeats (remote_engines.py).
    """

    def __init__(self, engine_args: EngineArgs, start_timeout_s: float = START_TIMEOUT_S, transport: str = "ipc"):
        import zmq

        from vjx.engine import core_proc, serial
        from vjx.engine.remote_engines import RemoteEngines

        self._zmq, self._serial = zmq, serial
        parallel_config = engine_args.create_parallel_config()
        self.engines = [
            core_proc.EngineProcess(engine_args, transport, data_parallel_rank=rank)
            for rank in range(parallel_config.local_data_parallel_size)
        ]
        self.engine = self.engines[0]
        self.context = zmq.Context()
        self.output_socket = self.context.socket(zmq.PULL)
        self.engine.bind(self.output_socket, "output")
        for engine in self.engines[1:]:
            engine.addresses["output"] = self.engine.addresses["output"]
        self.output_drops = serial.DropLog("the front end's output socket")
        self.input_sockets: list = []
        self.balancer = LoadBalancer(parallel_config.data_parallel_size)
        self.dead_error: EngineDeadError | None = None
        self._call_ids = itertools.count()
        self.remote = None
        try:
            if parallel_config.local_data_parallel_size < parallel_config.data_parallel_size:
                self.remote = RemoteEngines(self.context, parallel_config, self.output_socket)
            self.readies = core_proc.start_engines(self.engines, self.context, start_timeout_s)
            if self.remote is not None:
                self._add_remote_engines(start_timeout_s)
        except BaseException:
            self._close()
            raise
        self._output_tokens = [engine.token for engine in self.engines]
        for engine in self.engines:
            self.input_sockets.append(self.context.socket(zmq.PUSH))
            self.input_sockets[-1].connect(engine.addresses["input"])
        self.input_socket = self.input_sockets[0]
        self.ready = self.readies[0]

    def _add_remote_engines(self, start_timeout_s: float) -> None:
        """Waits for the replicas of other hosts; they must agree with this host's on the
        model length (every host takes the same engine arguments)."""
        for engine, ready in self.remote.wait_ready(start_timeout_s):
            self.engines.append(engine)
            self.readies.append(ready)
        for rank, ready in enumerate(self.readies):
            if ready.max_model_len != self.readies[0].max_model_len:
                raise RuntimeError(
                    f"Data-parallel replica {rank} has max_model_len={ready.max_model_len}, replica 0 "
                    f"{self.readies[0].max_model_len}: start every host with the same engine arguments."
                )

    def _mark_dead(self, message: str) -> EngineDeadError:
        if self.dead_error is None:
            self.dead_error = EngineDeadError(message)
        return self.dead_error

    def _engine_failed(self, failure) -> EngineDeadError:
        """A DEAD message: the traceback is logged here, once; the error keeps a short reason."""
        logger.error("EngineCore failed; the engine process exits. Its traceback:\n%s", failure.traceback)
        return self._mark_dead(dead_reason(failure.error))

    def _decode_output(self, frames: list[bytes]):
        """The (kind, payload) of a message on the output socket, or None for one that is
        dropped: a forged or malformed frame never stops the reader or marks the engine dead.
        The engines are checked on each drop, so a flood cannot hide their exit."""
        try:
            return self._serial.decode(frames, self._output_tokens, self._serial.OUTPUT_KINDS)
        except ValueError as e:
            self.output_drops.drop(e)
        self._check_engine()
        return None

    def _check_engine(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error
        for rank, engine in enumerate(self.engines):
            if not engine.is_alive():
                replica = f" of replica {rank}" if len(self.engines) > 1 else ""
                raise self._mark_dead(f"The engine process{replica} {engine.exit_description()}.")

    def _send(self, kind: bytes, payload, rank: int = 0) -> None:
        frames = self._serial.encode(self.engines[rank].token, kind, payload)
        self._check_engine()
        socket = self.input_sockets[rank]
        while not socket.poll(_POLL_MS, self._zmq.POLLOUT):
            self._check_engine()
        socket.send_multipart(frames, flags=self._zmq.NOBLOCK)

    def add_request(self, request: EngineCoreRequest) -> None:
        rank = self.balancer.assign(request.request_id)
        try:
            self._send(self._serial.ADD, request, rank)
        except BaseException:
            self.balancer.release([request.request_id])
            raise

    def abort_requests(self, request_ids: list[str]) -> None:
        for rank, ids in self.balancer.release(request_ids).items():
            self._send(self._serial.ABORT, ids, rank)

    def _send_utility(self, method: str, args: tuple = ()) -> list[int]:
        """Calls `method(*args)` on every replica; returns the call ids, in replica order."""
        call_ids = []
        for rank in range(len(self.engines)):
            call_ids.append(next(self._call_ids))
            self._send(self._serial.UTILITY, self._serial.UtilityCall(call_ids[-1], method, list(args)), rank)
        return call_ids

    def _decode_result(self, method: str, result):
        """The result's value; a ValueError in the engine (a bad argument) is raised as one."""
        if result.failure is not None:
            error_class = ValueError if result.failure.startswith("ValueError: ") else RuntimeError
            raise error_class(f"{method} failed in the engine: {result.failure}")
        value = self._serial.decode_result(method, result.result)
        return self._serial.loads_rpc(value) if method == "collective_rpc" else value

    def _rpc_args(self, method, args: tuple, kwargs: dict | None) -> tuple:
        """`collective_rpc`'s one utility argument: the pickle of the call."""
        return (self._serial.dumps_rpc((method, tuple(args), kwargs or {})),)

    def _note_outputs(self, outputs: EngineCoreOutputs) -> None:
        self.balancer.note_outputs(outputs)

    def _close(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        if self.remote is not None:
            self.remote.shutdown()
        for socket in (*self.input_sockets, self.output_socket):
            socket.close(linger=0)
        self.context.destroy(linger=0)

    def shutdown(self) -> None:
        """Stops the engine processes (idempotent); later calls raise EngineDeadError."""
        if self.context.closed:
            return
        self._mark_dead("The engine was shut down.")
        self._close()


class SyncMPClient(MPClient):
    """For `LLMEngine`: `get_output()` blocks until an engine process sends a step's outputs."""

    def __init__(self, engine_args: EngineArgs, start_timeout_s: float = START_TIMEOUT_S, transport: str = "ipc"):
        super().__init__(engine_args, start_timeout_s, transport)
        self._outputs: collections.deque[EngineCoreOutputs] = collections.deque()
        self._results: dict[int, object] = {}

    def _receive(self, deadline: float | None = None) -> None:
        """Reads one message: outputs are queued, results kept, errors raised; TimeoutError
        once `deadline` (a `time.monotonic()` value) passes."""
        self._check_dead_flag()
        while not self.output_socket.poll(_POLL_MS):
            self._check_engine()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("the engine did not answer in time.")
        message = self._decode_output(self.output_socket.recv_multipart())
        if message is None:
            return
        kind, payload = message
        if kind == self._serial.OUTPUTS:
            self._note_outputs(payload)
            self._outputs.append(payload)
        elif kind == self._serial.UTILITY_RESULT:
            self._results[payload.call_id] = payload
        elif kind == self._serial.REQUEST_ERROR:
            self.balancer.release([payload.request_id])
            raise EngineRequestError(payload.request_id, payload.message)
        elif kind == self._serial.DEAD:
            raise self._engine_failed(payload)

    def _check_dead_flag(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error

    def get_output(self) -> EngineCoreOutputs:
        while not self._outputs:
            self._receive()
        return self._outputs.popleft()

    def call_utility(self, method: str, *args, timeout: float | None = None):
        """`method(*args)`'s result, combined over the replicas; TimeoutError after `timeout` s."""
        call_ids = self._send_utility(method, args)
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(call_id not in self._results for call_id in call_ids):
            self._receive(deadline)
        results = [self._results.pop(call_id) for call_id in call_ids]
        return combine_results(method, [self._decode_result(method, result) for result in results])

    def make_stats(self) -> SchedulerStats:
        return self.call_utility("get_stats")

    def reset_prefix_cache(self) -> bool:
        return self.call_utility("reset_prefix_cache")

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.call_utility("sleep", level, mode)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        return self.call_utility("wake_up", tags)

    def is_sleeping(self) -> bool:
        return self.call_utility("is_sleeping")

    def profile(self, is_start: bool = True, trace_dir: str | None = None) -> None:
        self.call_utility("profile", is_start, trace_dir)

    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None):
        return self.call_utility("collective_rpc", *self._rpc_args(method, args, kwargs), timeout=timeout)


class AsyncMPClient(MPClient):
    """For `AsyncLLM`: a task reads the output socket; `get_output_async()` awaits its queue.

    The task notices a dead engine within a poll interval, so every waiter learns at once.
    """

    def __init__(self, engine_args: EngineArgs, start_timeout_s: float = START_TIMEOUT_S, transport: str = "ipc"):
        super().__init__(engine_args, start_timeout_s, transport)
        self._outputs: asyncio.Queue | None = None
        self._results: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None

    def _ensure_reader(self) -> asyncio.Queue:
        if self._reader is None:
            import zmq.asyncio

            self._outputs = asyncio.Queue()
            socket = zmq.asyncio.Socket.from_socket(self.output_socket)
            self._reader = asyncio.get_running_loop().create_task(self._read_outputs(socket))
        return self._outputs

    async def _read_outputs(self, socket) -> None:
        try:
            while True:
                if not await socket.poll(_POLL_MS):
                    self._check_engine()
                    continue
                message = self._decode_output(await socket.recv_multipart())
                if message is not None:
                    self._dispatch(*message)
        except EngineDeadError as e:
            self._fail_all(e)
        except Exception as e:
            self._fail_all(self._mark_dead(f"Reading the engine's outputs failed: {e!r}"))

    def _dispatch(self, kind: bytes, payload) -> None:
        if kind == self._serial.OUTPUTS:
            self._note_outputs(payload)
            self._outputs.put_nowait(payload)
        elif kind == self._serial.REQUEST_ERROR:
            self.balancer.release([payload.request_id])
            self._outputs.put_nowait(EngineRequestError(payload.request_id, payload.message))
        elif kind == self._serial.UTILITY_RESULT:
            future = self._results.pop(payload.call_id, None)
            if future is not None and not future.done():
                future.set_result(payload)
        elif kind == self._serial.DEAD:
            raise self._engine_failed(payload)

    def _fail_all(self, error: EngineDeadError) -> None:
        self._outputs.put_nowait(error)
        for future in self._results.values():
            if not future.done():
                future.set_exception(error)
        self._results.clear()

    async def get_output_async(self) -> EngineCoreOutputs:
        """The next step's outputs; raises EngineRequestError for a request the engine
        refused, EngineDeadError once the engine is gone."""
        item = await self._ensure_reader().get()
        if isinstance(item, EngineDeadError):
            self._outputs.put_nowait(item)
            raise item
        if isinstance(item, Exception):
            raise item
        return item

    async def call_utility_async(self, method: str, *args, timeout: float | None = None):
        """`method(*args)`'s result, combined over the replicas; TimeoutError after `timeout` s."""
        self._ensure_reader()
        loop = asyncio.get_running_loop()
        futures = []
        for call_id in self._send_utility(method, args):
            futures.append(loop.create_future())
            self._results[call_id] = futures[-1]
        results = await asyncio.wait_for(asyncio.gather(*futures), timeout)
        return combine_results(method, [self._decode_result(method, result) for result in results])

    async def get_stats_async(self) -> SchedulerStats:
        return await self.call_utility_async("get_stats")

    async def reset_prefix_cache_async(self) -> bool:
        return await self.call_utility_async("reset_prefix_cache")

    async def sleep_async(self, level: int = 1, mode: str = "abort") -> None:
        await self.call_utility_async("sleep", level, mode)

    async def wake_up_async(self, tags: list[str] | None = None) -> bool:
        return await self.call_utility_async("wake_up", tags)

    async def is_sleeping_async(self) -> bool:
        return await self.call_utility_async("is_sleeping")

    async def profile_async(self, is_start: bool = True, trace_dir: str | None = None) -> None:
        await self.call_utility_async("profile", is_start, trace_dir)

    async def collective_rpc_async(
        self, method, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ):
        return await self.call_utility_async("collective_rpc", *self._rpc_args(method, args, kwargs), timeout=timeout)

    def shutdown(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        super().shutdown()
