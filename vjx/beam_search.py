"""Beam search driven from outside the engine, as vLLM does it.

Each step asks the engine for ONE token per live beam with `logprobs=2 * beam_width`, so
every beam offers its 2 * beam_width best continuations (the sampled token among them).
Each candidate's cumulative logprob is its beam's plus the token's logprob; candidates
ending in EOS are set aside as completed (unless `ignore_eos`), and the best `beam_width`
of the rest, by `get_beam_search_score`, are the next step's beams. After `max_tokens`
steps the completed and live beams are ranked together and the best `beam_width` returned.
The engine's prefix cache keeps each step cheap: a beam's full KV blocks are found cached.

`BeamSearch` drives it through a blocking generate (`LLM.beam_search`), `AsyncBeamSearch`
through an async one (the server's, over `AsyncLLM`); both share every step but the call.
"""

import dataclasses
from collections.abc import Awaitable, Callable

from transformers import PreTrainedTokenizerBase

from vjx.outputs import Logprob, RequestOutput
from vjx.sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's beam search parameters."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    """0 takes each beam's best candidates; above 0 one of them is sampled (it joins the
    candidates when it is not among the best)."""
    length_penalty: float = 1.0
    """Scores divide the cumulative logprob by the length to this power."""
    include_stop_str_in_output: bool = False
    """Keep the EOS token in `tokens` of a beam that ended with it."""

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}.")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")


@dataclasses.dataclass
class BeamSearchSequence:
    """One beam: its tokens (prompt included, as in vLLM) and what it scored."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    """Per generated token, the candidates it was chosen from (the engine's logprobs dict)."""
    cum_logprob: float = 0.0
    text: str | None = None
    """The generated text (without the prompt and without EOS); set on returned beams."""
    finish_reason: str | None = None
    """"stop" (EOS) or "length"; set on returned beams."""
    stop_reason: int | str | None = None


@dataclasses.dataclass
class BeamSearchOutput:
    """The best `beam_width` beams of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def get_beam_search_score(
    tokens: list[int], cum_logprob: float, eos_token_id: int | None, length_penalty: float = 1.0
) -> float:
    """vLLM's score: the cumulative logprob over the length (prompt included, a final EOS
    not counted) to the power `length_penalty`."""
    seq_len = len(tokens)
    if tokens[-1] == eos_token_id:
        seq_len -= 1
    return cum_logprob / (seq_len**length_penalty)


GenerateFn = Callable[[list[dict], SamplingParams], list[RequestOutput]]
"""Runs token prompts to completion and returns their outputs in order (`LLM.generate`)."""
AsyncGenerateFn = Callable[[list[dict], SamplingParams], Awaitable[list[RequestOutput]]]
"""The same, awaited (the server's, over `AsyncLLM`)."""


@dataclasses.dataclass
class _Instance:
    """The search state of one prompt."""

    num_prompt_tokens: int
    beams: list[BeamSearchSequence]
    completed: list[BeamSearchSequence] = dataclasses.field(default_factory=list)


class _BeamSearchSteps:
    """The search without the engine call: the state of each prompt, the prompts a step
    runs, and how its outputs extend the beams."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_id: int | None, max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len

    @staticmethod
    def step_params(params: BeamSearchParams) -> SamplingParams:
        """One token per beam, with its 2 * beam_width best candidates."""
        return SamplingParams(logprobs=2 * params.beam_width, max_tokens=1, temperature=params.temperature)

    def step_prompts(self, instances: list[_Instance]) -> list[dict]:
        """The token prompts of the live beams (empty when the search is over)."""
        for instance in instances:
            self._retire_full_beams(instance)
        return [{"prompt_token_ids": beam.tokens} for instance in instances for beam in instance.beams]

    def advance(self, instances: list[_Instance], outputs: list[RequestOutput], params: BeamSearchParams) -> None:
        """Each instance's next beams from the step's outputs (in `step_prompts` order)."""
        outputs_iter = iter(outputs)
        for instance in instances:
            candidates = [c for beam in instance.beams for c in self._extend(beam, next(outputs_iter), params)]
            instance.completed += [c for c in candidates if c.finish_reason is not None]
            live = [c for c in candidates if c.finish_reason is None]
            instance.beams = self._sorted(live, params)[: params.beam_width]

    def new_instance(self, prompt) -> _Instance:
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            token_ids = list(prompt["prompt_token_ids"])
        else:
            text = prompt["prompt"] if isinstance(prompt, dict) else prompt
            token_ids = self.tokenizer.encode(text)
        return _Instance(num_prompt_tokens=len(token_ids), beams=[BeamSearchSequence(token_ids, [])])

    def _retire_full_beams(self, instance: _Instance) -> None:
        """Beams as long as the model allows cannot run again: they complete (by length)."""
        instance.completed += [beam for beam in instance.beams if len(beam.tokens) >= self.max_model_len]
        instance.beams = [beam for beam in instance.beams if len(beam.tokens) < self.max_model_len]

    def _extend(
        self, beam: BeamSearchSequence, output: RequestOutput, params: BeamSearchParams
    ) -> list[BeamSearchSequence]:
        """The beam's continuations, one per candidate token; those ending in EOS are
        finished ("stop")."""
        logprobs = output.outputs[0].logprobs
        if not logprobs:
            # The engine ended the request without a token (aborted): the beam ends here.
            return []
        candidates = []
        for token_id, logprob in logprobs[0].items():
            extended = BeamSearchSequence(
                tokens=beam.tokens + [token_id],
                logprobs=beam.logprobs + [logprobs[0]],
                cum_logprob=beam.cum_logprob + logprob.logprob,
            )
            if token_id == self.eos_token_id and not params.ignore_eos:
                if not params.include_stop_str_in_output:
                    extended.tokens.pop()
                extended.finish_reason, extended.stop_reason = "stop", token_id
            candidates.append(extended)
        return candidates

    def _sorted(self, beams: list[BeamSearchSequence], params: BeamSearchParams) -> list[BeamSearchSequence]:
        """Best score first; equal scores keep their order."""

        def score(beam: BeamSearchSequence) -> float:
            return get_beam_search_score(beam.tokens, beam.cum_logprob, self.eos_token_id, params.length_penalty)

        return sorted(beams, key=score, reverse=True)

    def finish(self, instance: _Instance, params: BeamSearchParams) -> BeamSearchOutput:
        best = self._sorted(instance.completed + instance.beams, params)[: params.beam_width]
        for beam in best:
            output_ids = beam.tokens[instance.num_prompt_tokens :]
            if beam.finish_reason is None:
                beam.finish_reason = "length"
            elif output_ids and output_ids[-1] == self.eos_token_id:
                output_ids = output_ids[:-1]
            beam.text = self.tokenizer.decode(output_ids)
        return BeamSearchOutput(sequences=best)


class BeamSearch(_BeamSearchSteps):
    """Runs beam searches through a generate function: the engine's API, nothing inside it."""

    def __init__(
        self, generate: GenerateFn, tokenizer: PreTrainedTokenizerBase, eos_token_id: int | None, max_model_len: int
    ):
        super().__init__(tokenizer, eos_token_id, max_model_len)
        self.generate = generate

    def run(self, prompts: list, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """One output per prompt (a str, `{"prompt": str}` or `{"prompt_token_ids": ids}`)."""
        instances = [self.new_instance(prompt) for prompt in prompts]
        for _ in range(params.max_tokens):
            step_prompts = self.step_prompts(instances)
            if not step_prompts:
                break
            self.advance(instances, self.generate(step_prompts, self.step_params(params)), params)
        return [self.finish(instance, params) for instance in instances]


class AsyncBeamSearch(_BeamSearchSteps):
    """`BeamSearch` over an async generate function (the server's)."""

    def __init__(
        self,
        generate: AsyncGenerateFn,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_id: int | None,
        max_model_len: int,
    ):
        super().__init__(tokenizer, eos_token_id, max_model_len)
        self.generate = generate

    async def run(self, prompts: list, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """One output per prompt, as `BeamSearch.run`."""
        instances = [self.new_instance(prompt) for prompt in prompts]
        for _ in range(params.max_tokens):
            step_prompts = self.step_prompts(instances)
            if not step_prompts:
                break
            self.advance(instances, await self.generate(step_prompts, self.step_params(params)), params)
        return [self.finish(instance, params) for instance in instances]
