"""OpenAIServing: what the completions and chat handlers share.

Model-name checks, prompt tokenization and length checks, the request -> `SamplingParams`
mapping, and the engine call that turns the engine's `ValueError`s into 400s.
"""

import asyncio
from collections.abc import AsyncGenerator

from serving.errors import OpenAIError
from serving.protocol import SamplingRequest
from serving.serving_models import OpenAIServingModels
from vjx.engine.async_llm import AsyncLLM, RequestOutputStream
from vjx.engine.exceptions import EngineDeadError
from vjx.sampling_params import RequestOutputKind, SamplingParams

_LOGIT_BIAS_LIMIT = 100.0


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, models: OpenAIServingModels):
        self.engine = engine
        self.models = models
        self.tokenizer = engine.get_tokenizer()
        self.max_model_len = engine.max_model_len
        self.max_logprobs = engine.config.model_config.max_logprobs

    def check_model(self, request) -> None:
        """404 unless the request names one of the served models (or none)."""
        if request.model is not None and not self.models.is_served(request.model):
            raise OpenAIError(f"The model `{request.model}` does not exist.", 404, "model")

    def tokenize(
        self,
        prompt: str | list[int],
        add_special_tokens: bool,
        truncate_prompt_tokens: int | None = None,
        param: str = "prompt",
    ) -> list[int]:
        """A prompt's token ids (its last `truncate_prompt_tokens` when set); an empty prompt
        is a 400 (an empty text may still tokenize to a BOS)."""
        if not prompt:
            raise OpenAIError(f"{param} must not be empty.", 400, param)
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            token_ids = list(prompt)
        if truncate_prompt_tokens is not None and truncate_prompt_tokens >= 1:
            token_ids = token_ids[-truncate_prompt_tokens:]
        return token_ids

    def check_lengths(self, num_prompt_tokens: int, max_tokens: int | None, param: str) -> int:
        """The request's max_tokens (what fits the context when None), or a 400 when the prompt
        and max_tokens together overflow max_model_len."""
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"prompt has {num_prompt_tokens} tokens, which leaves no room for a completion.",
                400,
                "prompt",
            )
        if max_tokens is None:
            return room
        if max_tokens < 1:
            raise OpenAIError(f"{param} must be at least 1, got {max_tokens}.", 400, param)
        if max_tokens > room:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, "
                f"{max_tokens} in the completion): {param} must be at most {room}.",
                400,
                param,
            )
        return max_tokens

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
        """The request's sampling fields as `SamplingParams` (unset ones keep vLLM's defaults);
        streams take DELTA outputs, the rest only the final one."""
        optional = {
            name: getattr(request, name) for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
        }
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
                output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
                **{name: value for name, value in optional.items() if value is not None},
            )
        except ValueError as e:
            raise OpenAIError.from_value_error(e, set(type(request).model_fields)) from None

    @staticmethod
    def _logit_bias(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
        if logit_bias is None:
            return None
        bias = {}
        for token, value in logit_bias.items():
            if not token.strip().lstrip("-").isdigit():
                raise OpenAIError(f"logit_bias keys must be token ids, got {token!r}.", 400, "logit_bias")
            if not -_LOGIT_BIAS_LIMIT <= value <= _LOGIT_BIAS_LIMIT:
                raise OpenAIError(
                    f"logit_bias values must be in [-100, 100], got {value} for token {token}.", 400, "logit_bias"
                )
            bias[int(token)] = value
        return bias

    async def add_requests(
        self, request: SamplingRequest, prompts: list[list[int]], params: list[SamplingParams], request_id: str
    ) -> list[RequestOutputStream]:
        """Adds one engine request per prompt (ids `{request_id}-{i}`, or `request_id` for one);
        the engine's checks (token ids out of the vocabulary, too many bad words, ...) become
        400s before anything runs."""
        await self.check_alive()
        streams: list[RequestOutputStream] = []
        try:
            for i, (prompt_token_ids, prompt_params) in enumerate(zip(prompts, params)):
                prompt = {"prompt_token_ids": prompt_token_ids}
                if request.cache_salt is not None:
                    prompt["cache_salt"] = request.cache_salt
                engine_id = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                streams.append(self.engine.add_request(engine_id, prompt, prompt_params, request.priority))
        except BaseException as e:
            for stream in streams:
                await stream.aclose()
            if isinstance(e, ValueError):
                raise OpenAIError.from_value_error(e, set(type(request).model_fields)) from None
            if isinstance(e, EngineDeadError):
                raise OpenAIError(f"The engine is dead: {e}", 503) from None
            raise
        return streams

    async def check_alive(self) -> None:
        try:
            await self.engine.check_health()
        except EngineDeadError as e:
            raise OpenAIError(f"The engine is dead: {e}", 503) from None


async def merge_streams(streams: list[RequestOutputStream]) -> AsyncGenerator[tuple[int, object], None]:
    """Yields (index of the stream, output) as outputs arrive from any of them; an error in
    one ends the merge with it, and leaving early closes (aborts) them all."""
    if len(streams) == 1:
        try:
            async for output in streams[0]:
                yield 0, output
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
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
