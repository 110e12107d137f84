"""BeamSearchStream: a request's beam search (`use_beam_search`) as one engine stream.

The search runs from outside the engine (vjx/beam_search.py): each step adds one engine
request per live beam and waits for all of them. The stream yields a single finished
`RequestOutput` whose completions are the best `n` beams, best first, so the handlers
treat it as any other request; closing it early aborts the step in flight.
"""

import asyncio

from serving.errors import OpenAIError
from vjx.beam_search import AsyncBeamSearch, BeamSearchParams
from vjx.engine.async_llm import AsyncLLM, RequestOutputStream
from vjx.lora.request import LoRARequest
from vjx.outputs import CompletionOutput, RequestOutput
from vjx.sampling_params import RequestOutputKind, SamplingParams


class BeamSearchStream:
    """`async for output in stream` yields the search's one final output."""

    def __init__(
        self,
        engine: AsyncLLM,
        request_id: str,
        prompt_token_ids: list[int],
        params: BeamSearchParams,
        lora_request: LoRARequest | None = None,
    ):
        self.engine = engine
        self.lora_request = lora_request
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.num_steps = 0
        self.finished = False

    def __aiter__(self) -> "BeamSearchStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        search = AsyncBeamSearch(
            self._generate,
            self.engine.get_tokenizer(),
            self.engine.input_processor.eos_token_id,
            self.engine.max_model_len,
        )
        (output,) = await search.run([{"prompt_token_ids": self.prompt_token_ids}], self.params)
        self.finished = True
        num_prompt_tokens = len(self.prompt_token_ids)
        completions = [
            CompletionOutput(
                index=i,
                text=beam.text,
                token_ids=beam.tokens[num_prompt_tokens:],
                cumulative_logprob=beam.cum_logprob,
                logprobs=beam.logprobs,
                finish_reason=beam.finish_reason,
                stop_reason=beam.stop_reason,
            )
            for i, beam in enumerate(output.sequences)
        ]
        return RequestOutput(self.request_id, None, self.prompt_token_ids, completions, finished=True)

    async def _generate(self, prompts: list[dict], params: SamplingParams) -> list[RequestOutput]:
        """One step: an engine request per beam (`{request_id}-beam{step}-{i}`), all awaited;
        a cancelled step aborts its requests."""
        params.output_kind = RequestOutputKind.FINAL_ONLY
        self.num_steps += 1
        streams: list[RequestOutputStream] = []
        try:
            for i, prompt in enumerate(prompts):
                request_id = f"{self.request_id}-beam{self.num_steps}-{i}"
                try:
                    streams.append(self.engine.add_request(request_id, prompt, params, lora_request=self.lora_request))
                except ValueError as e:
                    raise OpenAIError.from_value_error(e) from None
            return await asyncio.gather(*(_last(stream) for stream in streams))
        finally:
            for stream in streams:
                await stream.aclose()

    async def aclose(self) -> None:
        self.finished = True


async def _last(stream: RequestOutputStream) -> RequestOutput:
    """The step's output for one beam; a beam the engine could not run fails the request."""
    output = None
    async for item in stream:
        output = item
    if output is None or any(completion.finish_reason == "error" for completion in output.outputs):
        raise OpenAIError(f"The engine could not run request {stream.request_id}; see the server log.", 500)
    return output
