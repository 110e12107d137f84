"""EngineCoreClient: how the front end reaches EngineCore.

`InprocClient` calls it in this process. `SyncMPClient` (for `LLM`) and `AsyncMPClient` (for
`AsyncLLM`) talk to an `EngineCoreProc` in a child process over ZeroMQ; pyzmq and msgspec
are imported only when one of them is built, so vjx runs without them in-process.
"""

import asyncio
import collections
import itertools

from vjx.config import VjxConfig
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.core import EngineCore
from vjx.engine.exceptions import EngineDeadError, EngineRequestError
from vjx.engine.messages import EngineCoreOutputs, EngineCoreRequest
from vjx.engine_args import EngineArgs

_POLL_MS = 100
START_TIMEOUT_S = 1800.0
"""How long the engine process may take to load and compile before the client gives up."""


class InprocClient:
    """Calls EngineCore directly; `get_output()` runs one step."""

    def __init__(self, config: VjxConfig):
        self.engine_core = EngineCore(config)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def make_stats(self) -> SchedulerStats:
        return self.engine_core.make_stats()

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.scheduler.reset_prefix_cache()

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step_fn()

    def shutdown(self) -> None:
        """Nothing to stop: the engine lives and dies with this object."""


class MPClient:
    """The sockets and the engine process both multiprocess clients share.

    Sends go through a plain socket and never block on a dead engine: each waits for room
    in short polls and checks that the child still runs. `transport` is "ipc" (a private
    temp dir) or "tcp" (127.0.0.1 only).
    """

    def __init__(self, engine_args: EngineArgs, start_timeout_s: float = START_TIMEOUT_S, transport: str = "ipc"):
        import zmq

        from vjx.engine import core_proc, serial

        self._zmq, self._serial = zmq, serial
        self.engine = core_proc.EngineProcess(engine_args, transport)
        self.context = zmq.Context()
        self.input_socket = self.context.socket(zmq.PUSH)
        self.engine.bind(self.input_socket, "input")
        self.output_socket = self.context.socket(zmq.PULL)
        self.engine.bind(self.output_socket, "output")
        self.dead_error: EngineDeadError | None = None
        self._call_ids = itertools.count()
        try:
            self.ready = self.engine.start(self.context, start_timeout_s)
        except BaseException:
            self._close()
            raise

    def _mark_dead(self, message: str) -> EngineDeadError:
        if self.dead_error is None:
            self.dead_error = EngineDeadError(message)
        return self.dead_error

    def _check_engine(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error
        if not self.engine.is_alive():
            raise self._mark_dead(f"The engine process exited (exit code {self.engine.process.exitcode}).")

    def _send(self, kind: bytes, payload) -> None:
        frames = self._serial.encode(kind, payload)
        self._check_engine()
        while not self.input_socket.poll(_POLL_MS, self._zmq.POLLOUT):
            self._check_engine()
        self.input_socket.send_multipart(frames, flags=self._zmq.NOBLOCK)

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(self._serial.ADD, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._send(self._serial.ABORT, request_ids)

    def _send_utility(self, method: str) -> int:
        call_id = next(self._call_ids)
        self._send(self._serial.UTILITY, self._serial.UtilityCall(call_id, method))
        return call_id

    def _close(self) -> None:
        self.engine.shutdown()
        self.input_socket.close(linger=0)
        self.output_socket.close(linger=0)
        self.context.destroy(linger=0)

    def shutdown(self) -> None:
        """Stops the engine process (idempotent); later calls raise EngineDeadError."""
        if self.context.closed:
            return
        self._mark_dead("The engine was shut down.")
        self._close()


class SyncMPClient(MPClient):
    """For `LLMEngine`: `get_output()` blocks until the engine process sends a step's outputs."""

    def __init__(self, engine_args: EngineArgs, start_timeout_s: float = START_TIMEOUT_S, transport: str = "ipc"):
        super().__init__(engine_args, start_timeout_s, transport)
        self._outputs: collections.deque[EngineCoreOutputs] = collections.deque()
        self._results: dict[int, object] = {}

    def _receive(self) -> None:
        """Reads one message: outputs are queued, results kept, errors raised."""
        self._check_dead_flag()
        while not self.output_socket.poll(_POLL_MS):
            self._check_engine()
        kind, payload = self._serial.decode(self.output_socket.recv_multipart())
        if kind == self._serial.OUTPUTS:
            self._outputs.append(payload)
        elif kind == self._serial.UTILITY_RESULT:
            self._results[payload.call_id] = payload
        elif kind == self._serial.REQUEST_ERROR:
            raise EngineRequestError(payload.request_id, payload.message)
        elif kind == self._serial.DEAD:
            raise self._mark_dead(f"EngineCore failed:\n{payload}")

    def _check_dead_flag(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error

    def get_output(self) -> EngineCoreOutputs:
        while not self._outputs:
            self._receive()
        return self._outputs.popleft()

    def call_utility(self, method: str):
        call_id = self._send_utility(method)
        while call_id not in self._results:
            self._receive()
        result = self._results.pop(call_id)
        if result.failure is not None:
            raise RuntimeError(f"{method} failed in the engine: {result.failure}")
        return self._serial.decode_result(method, result.result)

    def make_stats(self) -> SchedulerStats:
        return self.call_utility("get_stats")

    def reset_prefix_cache(self) -> bool:
        return self.call_utility("reset_prefix_cache")


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
                self._dispatch(*self._serial.decode(await socket.recv_multipart()))
        except EngineDeadError as e:
            self._fail_all(e)
        except Exception as e:
            self._fail_all(self._mark_dead(f"Reading the engine's outputs failed: {e!r}"))

    def _dispatch(self, kind: bytes, payload) -> None:
        if kind == self._serial.OUTPUTS:
            self._outputs.put_nowait(payload)
        elif kind == self._serial.REQUEST_ERROR:
            self._outputs.put_nowait(EngineRequestError(payload.request_id, payload.message))
        elif kind == self._serial.UTILITY_RESULT:
            future = self._results.pop(payload.call_id, None)
            if future is not None and not future.done():
                future.set_result(payload)
        elif kind == self._serial.DEAD:
            raise self._mark_dead(f"EngineCore failed:\n{payload}")

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

    async def call_utility_async(self, method: str):
        self._ensure_reader()
        future = asyncio.get_running_loop().create_future()
        self._results[self._send_utility(method)] = future
        result = await future
        if result.failure is not None:
            raise RuntimeError(f"{method} failed in the engine: {result.failure}")
        return self._serial.decode_result(method, result.result)

    async def get_stats_async(self) -> SchedulerStats:
        return await self.call_utility_async("get_stats")

    async def reset_prefix_cache_async(self) -> bool:
        return await self.call_utility_async("reset_prefix_cache")

    def shutdown(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        super().shutdown()
