"""AsyncLLM: the asyncio front end; EngineCore runs in its own process.

Each request gets an asyncio queue. One task reads the engine's outputs, detokenizes them
with the same input and output processors as `LLMEngine`, and puts each `RequestOutput` in
its request's queue; `generate` (or the `RequestOutputStream` of `add_request`, which
validates the request before returning) yields from that queue. `RequestStatsListener`s
(the server's metrics) see the stats of every batch of outputs.
"""

import asyncio
from collections.abc import AsyncGenerator
from typing import Protocol, runtime_checkable

from vjx import process_setup
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.core_client import START_TIMEOUT_S, AsyncMPClient
from vjx.engine.exceptions import EngineDeadError, EngineRequestError
from vjx.engine.llm_engine import register_request, resolve_trace_dir
from vjx.engine.processors import make_processors
from vjx.engine_args import EngineArgs
from vjx.lora.request import LoRARequest
from vjx.metrics.stats import IterationStats
from vjx.outputs import RequestOutput
from vjx.sampling_params import SamplingParams


@runtime_checkable
class RequestStatsListener(Protocol):
    """Sees what each batch of engine outputs meant for the metrics (TTFT, latencies, token
    counts, finished requests): the `IterationStats` the output processor filled."""

    def record_iteration_stats(self, iteration_stats: IterationStats) -> None: ...


class AsyncLLM:
    """vLLM's AsyncLLM: `async for output in engine.generate(prompt, params, request_id)`.

    Cancelling (or closing) a generator aborts its request in the engine, which frees its
    blocks at once. Once the engine process dies, every waiting and later call raises
    `EngineDeadError`.
    """

    def __init__(
        self,
        engine_args: EngineArgs,
        start_timeout_s: float = START_TIMEOUT_S,
        transport: str = "ipc",
        stats_listeners: list[RequestStatsListener] | None = None,
    ):
        """`transport`: how to reach the engine process, "ipc" (a private temp dir) or "tcp"
        (127.0.0.1 only). `stats_listeners` are given the stats of every batch of
        outputs."""
        process_setup.setup_process()
        self.config = engine_args.create_engine_config()
        self.tokenizer, self.input_processor, self.output_processor = make_processors(
            self.config.model_config, self.config.lora_config
        )
        self.engine_core = AsyncMPClient(engine_args, start_timeout_s, transport)
        self.request_queues: dict[str, asyncio.Queue] = {}
        self.stats_listeners = list(stats_listeners or [])
        self._output_handler: asyncio.Task | None = None
        # Full collections skip the start-up heap (tokenizer, engine client) while this lives.
        process_setup.engine_started(self)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "AsyncLLM":
        return cls(engine_args)

    def get_tokenizer(self):
        return self.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.config.model_config.max_model_len

    @property
    def errored(self) -> bool:
        return self.engine_core.dead_error is not None

    async def check_health(self) -> None:
        """Raises `EngineDeadError` once the engine process is gone. The first call starts
        the output task, which watches the process from then on (noticing a death within
        a poll interval) even while no request runs."""
        self._start_output_handler()
        self._check_alive()

    def _check_alive(self) -> None:
        if self.engine_core.dead_error is not None:
            raise self.engine_core.dead_error

    def _add_request(
        self, request_id: str, prompt, params: SamplingParams, priority: int, lora_request: LoRARequest | None = None
    ) -> asyncio.Queue:
        self._check_alive()
        self._start_output_handler()
        if request_id in self.request_queues:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request.")
        request, prompt_text = self.input_processor.process_inputs(
            request_id, prompt, params, priority=priority, lora_request=lora_request
        )
        engine_requests = register_request(self.output_processor, request, prompt_text)
        queue: asyncio.Queue = asyncio.Queue()
        self.request_queues[request_id] = queue
        try:
            for engine_request in engine_requests:
                self.engine_core.add_request(engine_request)
        except BaseException:
            self._abort([request_id])
            raise
        return queue

    def _start_output_handler(self) -> None:
        if self._output_handler is None:
            self._output_handler = asyncio.get_running_loop().create_task(self._handle_outputs())

    def add_request(
        self,
        request_id: str,
        prompt,
        sampling_params: SamplingParams,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> "RequestOutputStream":
        """Adds the request at once (a bad one raises `ValueError` here) and returns its
        output stream; closing the stream before its last output aborts the request."""
        queue = self._add_request(request_id, prompt, sampling_params, priority, lora_request)
        return RequestOutputStream(self, request_id, queue)

    async def generate(
        self,
        prompt,
        sampling_params: SamplingParams,
        request_id: str,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yields the request's outputs as they come (what each holds follows
        `sampling_params.output_kind`; DELTA gives only the new tokens and text)."""
        stream = self.add_request(request_id, prompt, sampling_params, priority, lora_request)
        try:
            async for output in stream:
                yield output
        finally:
            await stream.aclose()

    async def abort(self, request_id: str | list[str]) -> None:
        """Aborts unfinished requests; their generators end without another output."""
        self._abort([request_id] if isinstance(request_id, str) else list(request_id))

    def _abort(self, request_ids: list[str], end_item: Exception | None = None) -> None:
        """Stops tracking the requests, ends their streams with `end_item` (None: quietly)
        and aborts them in the engine."""
        engine_ids = self.output_processor.abort_requests(request_ids)
        self._close_queues(request_ids, end_item)
        if self.engine_core.dead_error is None:
            self.engine_core.abort_requests(engine_ids)

    async def _handle_outputs(self) -> None:
        while True:
            try:
                outputs = await self.engine_core.get_output_async()
            except EngineRequestError as e:
                self._fail_request(e)
                continue
            except EngineDeadError as e:
                self._close_queues(list(self.request_queues), e)
                return
            iteration_stats = IterationStats() if self.stats_listeners else None
            processed = self.output_processor.process_outputs(outputs.outputs, outputs.timestamp, iteration_stats)
            if iteration_stats is not None and outputs.outputs:
                for listener in self.stats_listeners:
                    listener.record_iteration_stats(iteration_stats)
            for output in processed.request_outputs:
                queue = self.request_queues.get(output.request_id)
                if queue is not None:
                    queue.put_nowait(output)
            self.engine_core.abort_requests(processed.reqs_to_abort)

    def _close_queues(self, request_ids: list[str], end_item: Exception | None) -> None:
        """Puts `end_item` (None: end quietly) last in the requests' queues and forgets them."""
        for request_id in request_ids:
            queue = self.request_queues.pop(request_id, None)
            if queue is not None:
                queue.put_nowait(end_item)

    def end_stream(self, request_id: str) -> None:
        """Frees `request_id` for a new request once its stream has read its last output
        (until then an unread finished output still holds the id)."""
        self.request_queues.pop(request_id, None)

    def _fail_request(self, error: EngineRequestError) -> None:
        state = self.output_processor.request_states.get(error.request_id)
        request_id = state.parent.request_id if state is not None and state.parent is not None else error.request_id
        self._abort([request_id], end_item=error)

    async def get_stats(self) -> SchedulerStats:
        return await self.engine_core.get_stats_async()

    async def reset_prefix_cache(self) -> bool:
        return await self.engine_core.reset_prefix_cache_async()

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """`LLMEngine.add_lora`: a bad adapter raises ValueError here."""
        self.input_processor.check_lora_request(lora_request)
        return await self.engine_core.call_utility_async("add_lora", lora_request)

    async def remove_lora(self, lora_id: int) -> bool:
        return await self.engine_core.call_utility_async("remove_lora", lora_id)

    async def pin_lora(self, lora_id: int) -> bool:
        return await self.engine_core.call_utility_async("pin_lora", lora_id)

    async def list_loras(self) -> set[int]:
        return await self.engine_core.call_utility_async("list_loras")

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """`LLM.sleep`'s levels and modes; with "abort" the unfinished requests' streams end.
        Requests added while asleep wait for `wake_up`, as in vLLM."""
        if mode == "abort":
            self._abort(list(self.request_queues))
        await self.engine_core.sleep_async(level, mode)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        return await self.engine_core.wake_up_async(tags)

    async def is_sleeping(self) -> bool:
        return await self.engine_core.is_sleeping_async()

    async def start_profile(
        self, profile_prefix: str | None = None, *, profile_dir: str | None = None, **bounds
    ) -> None:
        """`LLM.start_profile`: a JAX trace of the engine process into `profile_dir` or
        $VLLM_TORCH_PROFILER_DIR."""
        await self.engine_core.profile_async(True, resolve_trace_dir(profile_prefix, profile_dir, **bounds))

    async def stop_profile(self) -> None:
        await self.engine_core.profile_async(False)

    async def collective_rpc(self, method, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None):
        """`LLM.collective_rpc` (the call is pickled to the engine process)."""
        return await self.engine_core.collective_rpc_async(method, timeout, args, kwargs)

    def shutdown(self) -> None:
        """Stops the output task and the engine process; safe to call more than once."""
        if self._output_handler is not None:
            self._output_handler.cancel()
        self.engine_core.shutdown()
        process_setup.engine_stopped(self)


class RequestOutputStream:
    """One request's outputs from `AsyncLLM.add_request`: `async for output in stream`.

    Ends after the finished output, quietly after an `abort`, or with the engine's error.
    `aclose()` aborts the request unless it has finished; call it whenever iteration stops
    early (also when it never began).
    """

    def __init__(self, engine: AsyncLLM, request_id: str, queue: asyncio.Queue):
        self.engine = engine
        self.request_id = request_id
        self.queue = queue
        self.finished = False

    def __aiter__(self) -> "RequestOutputStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self.queue.get()
        if item is None:
            # Aborted through `abort`: the stream ends without another output.
            self._finish()
            raise StopAsyncIteration
        if isinstance(item, Exception):
            self._finish()
            raise item
        if item.finished:
            self._finish()
        return item

    def _finish(self) -> None:
        self.finished = True
        self.engine.end_stream(self.request_id)

    async def aclose(self) -> None:
        if not self.finished:
            await self.engine.abort(self.request_id)
            self._finish()
