"""AsyncLLM: the asyncio front end; EngineCore runs in its own process.

Each request gets an asyncio queue. One task reads the engine's outputs, detokenizes them
with the same input and output processors as `LLMEngine`, and puts each `RequestOutput` in
its request's queue; `generate` yields from that queue.
"""

import asyncio
from collections.abc import AsyncGenerator

import transformers

from vjx.core.sched.stats import SchedulerStats
from vjx.engine.core_client import START_TIMEOUT_S, AsyncMPClient
from vjx.engine.exceptions import EngineDeadError, EngineRequestError
from vjx.engine.input_processor import InputProcessor
from vjx.engine.llm_engine import register_request
from vjx.engine.output_processor import OutputProcessor
from vjx.engine_args import EngineArgs
from vjx.outputs import RequestOutput
from vjx.sampling_params import SamplingParams


class AsyncLLM:
    """vLLM's AsyncLLM: `async for output in engine.generate(prompt, params, request_id)`.

    Cancelling (or closing) a generator aborts its request in the engine, which frees its
    blocks at once. Once the engine process dies, every waiting and later call raises
    `EngineDeadError`.
    """

    def __init__(self, engine_args: EngineArgs, start_timeout_s: float = START_TIMEOUT_S, transport: str = "ipc"):
        """`transport`: how to reach the engine process, "ipc" (a private temp dir) or "tcp"
        (127.0.0.1 only)."""
        self.config = engine_args.create_engine_config()
        model_config = self.config.model_config
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_config.tokenizer)
        self.input_processor = InputProcessor(model_config, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.engine_core = AsyncMPClient(engine_args, start_timeout_s, transport)
        self.request_queues: dict[str, asyncio.Queue] = {}
        self._output_handler: asyncio.Task | None = None

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "AsyncLLM":
        return cls(engine_args)

    def get_tokenizer(self):
        return self.tokenizer

    @property
    def errored(self) -> bool:
        return self.engine_core.dead_error is not None

    def _check_alive(self) -> None:
        if self.engine_core.dead_error is not None:
            raise self.engine_core.dead_error

    def _add_request(self, request_id: str, prompt, params: SamplingParams, priority: int) -> asyncio.Queue:
        self._check_alive()
        if self._output_handler is None:
            self._output_handler = asyncio.get_running_loop().create_task(self._handle_outputs())
        if request_id in self.request_queues:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request.")
        request, prompt_text = self.input_processor.process_inputs(request_id, prompt, params, priority=priority)
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

    async def generate(
        self, prompt, sampling_params: SamplingParams, request_id: str, priority: int = 0
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yields the request's outputs as they come (what each holds follows
        `sampling_params.output_kind`; DELTA gives only the new tokens and text)."""
        queue = self._add_request(request_id, prompt, sampling_params, priority)
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if item is None:
                    # Aborted through `abort`: the stream ends without another output.
                    finished = True
                    return
                if isinstance(item, Exception):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._abort([request_id])
            self.request_queues.pop(request_id, None)

    async def abort(self, request_id: str | list[str]) -> None:
        """Aborts unfinished requests; their generators end without another output."""
        self._abort([request_id] if isinstance(request_id, str) else list(request_id))

    def _abort(self, request_ids: list[str], end_item: Exception | None = None) -> None:
        """Stops tracking the requests, ends their streams with `end_item` (None: quietly)
        and aborts them in the engine."""
        engine_ids = self.output_processor.abort_requests(request_ids)
        for request_id in request_ids:
            queue = self.request_queues.pop(request_id, None)
            if queue is not None:
                queue.put_nowait(end_item)
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
                for queue in self.request_queues.values():
                    queue.put_nowait(e)
                return
            processed = self.output_processor.process_outputs(outputs.outputs)
            for output in processed.request_outputs:
                queue = self.request_queues.get(output.request_id)
                if queue is not None:
                    queue.put_nowait(output)
            self.engine_core.abort_requests(processed.reqs_to_abort)

    def _fail_request(self, error: EngineRequestError) -> None:
        state = self.output_processor.request_states.get(error.request_id)
        request_id = state.parent.request_id if state is not None and state.parent is not None else error.request_id
        self._abort([request_id], end_item=error)

    async def get_stats(self) -> SchedulerStats:
        return await self.engine_core.get_stats_async()

    async def reset_prefix_cache(self) -> bool:
        return await self.engine_core.reset_prefix_cache_async()

    def shutdown(self) -> None:
        """Stops the output task and the engine process; safe to call more than once."""
        if self._output_handler is not None:
            self._output_handler.cancel()
        self.engine_core.shutdown()
