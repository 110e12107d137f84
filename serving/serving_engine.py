"""OpenAIServing: what the completions and chat handlers share.

Model-name checks, the operator's limits (ServerArgs), prompt tokenization (off the event
loop, through the TokenizerPool) and length checks, the request -> `SamplingParams`
mapping, and the engine call: refused with a 503 while the engine already holds
`--max-num-queued-reqs` requests, and turning the engine's `ValueError`s into 400s; a
response's per-request `metrics`.
"""

import asyncio
from collections.abc import AsyncGenerator

from serving.beam_search_stream import BeamSearchStream
from serving.chat_utils import apply_chat_template, conversation_size
from serving.errors import OpenAIError
from serving.metrics import ServerMetrics
from serving.protocol import PerRequestMetrics, SamplingRequest, SpeculativeDecodingMetrics, UsageInfo
from serving.server_args import ServerArgs
from serving.serving_models import OpenAIServingModels
from serving.structured_outputs import structured_outputs_of
from serving.tokenizer_pool import TokenizerPool
from vjx.beam_search import BeamSearchParams
from vjx.config import ModelConfig
from vjx.engine.async_llm import AsyncLLM, RequestOutputStream
from vjx.engine.exceptions import EngineDeadError
from vjx.outputs import RequestOutput
from vjx.sampling_params import RequestOutputKind, SamplingParams

_DEFAULTED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""Request fields that, when unset, take the generation config's default (vLLM's)."""
RETRY_AFTER_S = 1
"""What a busy server's 503 tells the client to wait before trying again."""


class OpenAIServing:
    def __init__(
        self,
        engine: AsyncLLM,
        models: OpenAIServingModels,
        server_args: ServerArgs,
        tokenizer_pool: TokenizerPool,
        chat_template: str | None = None,
        *,
        metrics: ServerMetrics | None = None,
    ):
        """`chat_template`: the server's (None: the tokenizer's), for the routes that take chats;
        `metrics` counts the requests refused at admission."""
        self.engine = engine
        self.metrics = metrics
        self.chat_template = chat_template
        self.models = models
        self.server_args = server_args
        self.tokenizer_pool = tokenizer_pool
        self.tokenizer = engine.get_tokenizer()
        self.max_model_len = engine.max_model_len
        self.max_logprobs = engine.config.model_config.max_logprobs
        self.default_sampling_params, self.override_max_tokens = _sampling_defaults(engine.config.model_config)
        config = engine.config
        num_running = config.scheduler_config.max_num_seqs * config.parallel_config.data_parallel_size
        self.max_num_queued_reqs = server_args.queued_reqs_limit(num_running)

    async def render_chat(
        self,
        messages,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        chat_template_kwargs: dict | None = None,
        tools: list | None = None,
    ) -> str:
        """The chat through the chat template (the request's `chat_template`, else the
        server's), in the tokenizer pool (a huge chat takes long), with the request's `tools`.
        A request's own template, also one inside `chat_template_kwargs`, needs
        --trust-request-chat-template (vLLM's)."""
        requested = chat_template or (chat_template_kwargs or {}).get("chat_template")
        if requested is not None and not self.server_args.trust_request_chat_template:
            raise OpenAIError(
                "Chat template is passed with request, but --trust-request-chat-template is not set. "
                "Refused request with untrusted chat template.",
                400,
                "chat_template",
            )
        return await self.tokenizer_pool.run(
            conversation_size(messages),
            apply_chat_template,
            self.tokenizer,
            messages,
            requested or self.chat_template,
            add_generation_prompt,
            continue_final_message,
            chat_template_kwargs,
            [tool.model_dump() for tool in tools] if tools else None,
        )

    def check_model(self, request) -> None:
        """404 unless the request names one of the served models (or none)."""
        if request.model is not None and not self.models.is_served(request.model):
            raise OpenAIError(f"The model `{request.model}` does not exist.", 404, "model")

    def check_limits(self, request: SamplingRequest) -> None:
        """The operator's limits on `n` and on the stop strings (--max-n, --max-stop-strings,
        --max-stop-string-length), and the field combinations vLLM refuses."""
        options = request.stream_options
        # vLLM's test is the JSON value's truth: `{}` (and null) without `stream` is accepted.
        if options is not None and (options.model_fields_set or options.model_extra) and not request.stream:
            raise OpenAIError("Stream options can only be defined when `stream=True`.", 400, "stream_options")
        if request.stream and request.prompt_logprobs:
            raise OpenAIError("`prompt_logprobs` are not available when `stream=True`.", 400, "prompt_logprobs")
        if request.stream and request.use_beam_search:
            raise OpenAIError("Streaming is not currently supported with beam search.", 400, "use_beam_search")
        args = self.server_args
        if request.n > args.max_n:
            raise OpenAIError(f"n must be at most {args.max_n} (the server's limit), got {request.n}.", 400, "n")
        stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
        if len(stop) > args.max_stop_strings:
            raise OpenAIError(
                f"stop may hold at most {args.max_stop_strings} strings (the server's limit), got {len(stop)}.",
                400,
                "stop",
            )
        longest = max(stop, key=len, default="")
        if len(longest) > args.max_stop_string_length:
            raise OpenAIError(
                f"stop strings may be at most {args.max_stop_string_length} characters long (the server's limit), "
                f"got one of {len(longest)}.",
                400,
                "stop",
            )

    async def tokenize(
        self, prompt: str | list[int], add_special_tokens: bool, request: SamplingRequest, param: str = "prompt"
    ) -> list[int]:
        """A prompt's token ids, cut to the request's `truncate_prompt_tokens` (its last ones,
        or its first with `truncation_side="right"`); an empty prompt is a 400 (an empty text
        may still tokenize to a BOS)."""
        if not prompt:
            raise OpenAIError(f"{param} must not be empty.", 400, param)
        if isinstance(prompt, str):
            token_ids = await self.tokenizer_pool.encode(prompt, add_special_tokens)
        else:
            token_ids = list(prompt)
        num_kept = request.truncate_prompt_tokens
        if num_kept is not None and num_kept >= 1:
            token_ids = token_ids[:num_kept] if request.truncation_side == "right" else token_ids[-num_kept:]
        return token_ids

    def check_lengths(self, num_prompt_tokens: int, max_tokens: int | None, param: str) -> int:
        """The request's max_tokens, at most `override_max_tokens` (when None: the generation
        config's default, at most what fits the context and --max-tokens-limit), or a 400
        when it passes --max-tokens-limit or the prompt and max_tokens together overflow
        max_model_len."""
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"prompt has {num_prompt_tokens} tokens, which leaves no room for a completion.",
                400,
                "prompt",
            )
        limit = self.server_args.max_tokens_limit
        if max_tokens is None:
            default = self.default_sampling_params.get("max_tokens")
            return min(v for v in (room, limit, default, self.override_max_tokens) if v is not None)
        if max_tokens < 1:
            raise OpenAIError(f"{param} must be at least 1, got {max_tokens}.", 400, param)
        if limit is not None and max_tokens > limit:
            raise OpenAIError(f"{param} must be at most {limit} (the server's limit), got {max_tokens}.", 400, param)
        if max_tokens > room:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, "
                f"{max_tokens} in the completion): {param} must be at most {room}.",
                400,
                param,
            )
        return max_tokens if self.override_max_tokens is None else min(max_tokens, self.override_max_tokens)

    def check_logprobs(self, num_logprobs: int | None, param: str) -> None:
        if num_logprobs is not None and num_logprobs > self.max_logprobs:
            raise OpenAIError(
                f"{param} must be at most max_logprobs={self.max_logprobs} (the server's limit), got {num_logprobs}.",
                400,
                param,
            )

    def to_sampling_params(
        self, request: SamplingRequest, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None
    ) -> SamplingParams:
        """The request's sampling fields as `SamplingParams`: an unset one takes the
        generation config's default, else vLLM's; streams take DELTA outputs, the rest only
        the final one."""
        optional = {}
        for name in _DEFAULTED_FIELDS:
            value = getattr(request, name)
            optional[name] = self.default_sampling_params.get(name) if value is None else value
        try:
            return SamplingParams(
                n=request.n,
                max_tokens=max_tokens,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                presence_penalty=request.presence_penalty,
                frequency_penalty=request.frequency_penalty,
                seed=request.seed,
                stop=request.stop,
                stop_token_ids=request.stop_token_ids,
                ignore_eos=request.ignore_eos,
                min_tokens=request.min_tokens,
                include_stop_str_in_output=request.include_stop_str_in_output,
                skip_special_tokens=request.skip_special_tokens,
                spaces_between_special_tokens=request.spaces_between_special_tokens,
                logit_bias=self._logit_bias(request.logit_bias),
                allowed_token_ids=request.allowed_token_ids,
                bad_words=request.bad_words,
                truncate_prompt_tokens=request.truncate_prompt_tokens,
                structured_outputs=structured_outputs_of(request.response_format, request.structured_outputs),
                output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
                **{name: value for name, value in optional.items() if value is not None},
            )
        except ValueError as e:
            raise OpenAIError.from_value_error(e, set(type(request).model_fields)) from None

    def to_beam_search_params(self, request: SamplingRequest, max_tokens: int) -> BeamSearchParams:
        """vLLM's: `n` beams; an unset temperature is the generation config's, else 1."""
        temperature = request.temperature
        if temperature is None:
            temperature = self.default_sampling_params.get("temperature", 1.0)
        try:
            return BeamSearchParams(
                beam_width=request.n,
                max_tokens=max_tokens,
                ignore_eos=request.ignore_eos,
                temperature=temperature,
                length_penalty=request.length_penalty,
                include_stop_str_in_output=request.include_stop_str_in_output,
            )
        except ValueError as e:
            raise OpenAIError.from_value_error(e, set(type(request).model_fields)) from None

    def make_params(
        self, request: SamplingRequest, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None
    ) -> SamplingParams | BeamSearchParams:
        """The engine parameters of one prompt: a beam search's with `use_beam_search`."""
        if request.use_beam_search:
            if request.structured_outputs is not None or (
                request.response_format is not None and request.response_format.type != "text"
            ):
                raise OpenAIError("use_beam_search cannot follow structured outputs yet.", 400, "use_beam_search")
            return self.to_beam_search_params(request, max_tokens)
        return self.to_sampling_params(request, max_tokens, logprobs, prompt_logprobs)

    def usage(self, num_prompt_tokens: int, num_generated: int, outputs: list) -> UsageInfo:
        """The usage of `outputs`; with --enable-prompt-tokens-details their cached tokens."""
        num_cached = None
        if self.server_args.enable_prompt_tokens_details:
            num_cached = sum(output.num_cached_tokens or 0 for output in outputs)
        return UsageInfo.of(num_prompt_tokens, num_generated, num_cached)

    @staticmethod
    def _logit_bias(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
        """The JSON keys as token ids (Python's `int`, as vLLM reads them); every key that is
        not one is named in the 400. `SamplingParams` clamps each bias to [-100, 100]."""
        if logit_bias is None:
            return None
        bias, bad_keys = {}, []
        for token, value in logit_bias.items():
            try:
                bias[int(token)] = value
            except ValueError:
                bad_keys.append(token)
        if bad_keys:
            raise OpenAIError(
                f"logit_bias contains key(s) that cannot be converted to integer token IDs: {bad_keys!r}.",
                400,
                "logit_bias",
            )
        return bias

    async def add_requests(
        self,
        request: SamplingRequest,
        prompts: list[list[int]],
        params: list[SamplingParams | BeamSearchParams],
        request_id: str,
    ) -> list[RequestOutputStream | BeamSearchStream]:
        """Adds one engine request per prompt (ids `{request_id}-{i}`, or `request_id` for one),
        or one beam search, with the LoRA adapter `model` names; the engine's checks (token ids
        out of the vocabulary, too many bad words, ...) become 400s before anything runs."""
        await self.check_alive()
        self.check_admission(sum(p.beam_width if isinstance(p, BeamSearchParams) else p.n for p in params))
        self.check_model(request)  # an adapter unloaded since the request came is a 404 too
        lora_request = self.models.lora_request(request.model)
        streams: list[RequestOutputStream | BeamSearchStream] = []
        try:
            for i, (prompt_token_ids, prompt_params) in enumerate(zip(prompts, params)):
                engine_id = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                if isinstance(prompt_params, BeamSearchParams):
                    stream = BeamSearchStream(self.engine, engine_id, prompt_token_ids, prompt_params, lora_request)
                    streams.append(stream)
                    continue
                prompt = {"prompt_token_ids": prompt_token_ids}
                if request.cache_salt is not None:
                    prompt["cache_salt"] = request.cache_salt
                streams.append(
                    self.engine.add_request(engine_id, prompt, prompt_params, request.priority, lora_request)
                )
        except BaseException as e:
            for stream in streams:
                await stream.aclose()
            if isinstance(e, ValueError):
                raise OpenAIError.from_value_error(e, set(type(request).model_fields)) from None
            if isinstance(e, EngineDeadError):
                raise OpenAIError.engine_dead(e) from None
            raise
        return streams

    def check_admission(self, num_requests: int) -> None:
        """A 503 with Retry-After when `num_requests` more engine requests would pass
        --max-num-queued-reqs; the count is the front end's (each of a request's `n`
        completions is one), so it holds before the engine sees anything. No await comes
        between this check and the adds, so concurrent requests cannot both pass it."""
        num_unfinished = self.engine.output_processor.get_num_unfinished_requests()
        if num_unfinished + num_requests > self.max_num_queued_reqs:
            if self.metrics is not None:
                self.metrics.record_admission_rejection("max_num_queued_reqs")
            raise OpenAIError(
                "The server is busy: too many requests are in flight; retry in a moment.",
                503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    async def check_alive(self) -> None:
        try:
            await self.engine.check_health()
        except EngineDeadError as e:
            raise OpenAIError.engine_dead(e) from None


def _sampling_defaults(model_config: ModelConfig) -> tuple[dict, int | None]:
    """vLLM's request defaults: the generation config's sampling parameters, and the cap on
    every request's max_tokens, the `max_new_tokens` of a generation config given as a
    directory or of `override_generation_config` (the model's own only sets the default)."""
    defaults = model_config.get_diff_sampling_param()
    if model_config.generation_config in ("auto", "vllm"):
        return defaults, model_config.override_generation_config.get("max_new_tokens")
    return defaults, defaults.get("max_tokens")


def per_request_metrics(outputs: list[RequestOutput], n: int) -> PerRequestMetrics | None:
    """vLLM's `metrics` of a response: the speculative decoding of its one sequence (one
    prompt, n = 1: of several, the figures would be one sequence's), None without them."""
    if len(outputs) != 1 or n != 1 or not outputs[0].outputs:
        return None
    metrics = outputs[0].outputs[0].spec_decode_metrics
    if metrics is None:
        return None
    return PerRequestMetrics(speculative_decoding=SpeculativeDecodingMetrics(**metrics.to_dict()))


async def merge_streams(streams: list[RequestOutputStream]) -> AsyncGenerator[tuple[int, object], None]:
    """Yields (index of the stream, output) as outputs arrive from any of them; an error in
    one ends the merge with it, and leaving early closes (aborts) them all."""
    if len(streams) == 1:
        try:
            async for output in streams[0]:
                yield 0, _checked(output)
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def drain(index: int, stream: RequestOutputStream) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
            await queue.put((index, done))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((index, e))

    tasks = [asyncio.create_task(drain(i, stream)) for i, stream in enumerate(streams)]
    try:
        num_running = len(tasks)
        while num_running:
            index, item = await queue.get()
            if item is done:
                num_running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, _checked(item)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def _checked(output):
    """The output, unless the engine could not run the request (a failure pinned to it,
    logged in the engine): then the request fails with a 500 that names no internals."""
    if any(completion.finish_reason == "error" for completion in output.outputs):
        raise OpenAIError(f"The engine could not run request {output.request_id}; see the server log.", 500)
    return output
