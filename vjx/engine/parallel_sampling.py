"""Parallel sampling (`n > 1`): one user request fanned out into n child requests.

EngineCore knows only the children: each is an ordinary request with `n=1`, so the
scheduler and the runner need no notion of a group. The children's prompts are identical,
so the prefix cache shares their prompt KV. The output processor hands each child's
completion to its `ParentRequest`, which gives users one `RequestOutput` under the parent's
id, its completions ordered by `CompletionOutput.index`.
"""

import dataclasses

from vjx.engine.messages import EngineCoreRequest
from vjx.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from vjx.sampling_params import RequestOutputKind, SamplingParams
from vjx.validation import INT64_MIN


class ParentRequest:
    """The user-visible request behind n children; aggregates their completions."""

    def __init__(self, request: EngineCoreRequest, prompt: str | None):
        """`request` is the processed request of the whole group (its `n` children)."""
        self.request = request
        self.request_id = request.request_id
        self.sampling_params = request.sampling_params
        self.output_kind = self.sampling_params.output_kind
        self.prompt = prompt
        self.child_request_ids = [f"{index}_{self.request_id}" for index in range(self.sampling_params.n)]
        self.unfinished_child_ids = set(self.child_request_ids)
        self.prompt_logprobs: PromptLogprobs | None = None
        self.num_cached_tokens: int | None = None
        self._completions: dict[int, CompletionOutput] = {}
        """CUMULATIVE and FINAL_ONLY: each child's latest completion; DELTA: this step's."""

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        """Child `index`'s request id and params: `n=1`, and `seed + index` when seeded
        (wrapped into the int64 range), so the children sample different tokens yet each is
        reproducible."""
        params = self.sampling_params
        seed = None if params.seed is None else (params.seed + index - INT64_MIN) % 2**64 + INT64_MIN
        return self.child_request_ids[index], dataclasses.replace(params, n=1, seed=seed)

    def make_child_request(self, index: int) -> EngineCoreRequest:
        request_id, params = self.get_child_info(index)
        return dataclasses.replace(self.request, request_id=request_id, sampling_params=params)

    def add_child_output(
        self,
        child_request_id: str,
        completion: CompletionOutput,
        prompt_logprobs: PromptLogprobs | None,
        num_cached_tokens: int,
    ) -> None:
        """Takes one child's completion of this step (a finished one finishes the child)."""
        if completion.finished():
            self.finish_child(child_request_id)
        self._completions[completion.index] = completion
        if prompt_logprobs and self.prompt_logprobs is None:
            # Every child computes the same prompt logprobs: the first to arrive are kept.
            self.prompt_logprobs = prompt_logprobs
        # The prompt is computed once, by the first child scheduled; the others find it in the
        # prefix cache. The parent's count is what came from the cache before it arrived.
        previous = self.num_cached_tokens
        self.num_cached_tokens = num_cached_tokens if previous is None else min(previous, num_cached_tokens)

    def finish_child(self, child_request_id: str) -> None:
        """Marks a child done (finished, or aborted without a last output)."""
        self.unfinished_child_ids.discard(child_request_id)

    @property
    def finished(self) -> bool:
        return not self.unfinished_child_ids

    def make_request_output(self) -> RequestOutput | None:
        """The parent's output after a step, or None when its output kind shows nothing yet."""
        if self.output_kind == RequestOutputKind.FINAL_ONLY and not self.finished:
            return None
        completions = [self._completions[index] for index in sorted(self._completions)]
        prompt_logprobs = self.prompt_logprobs
        if self.output_kind == RequestOutputKind.DELTA:
            self._completions = {}
            if prompt_logprobs is not None:
                # Handed out once; `[]` (not None) also keeps later children's copies out.
                self.prompt_logprobs = []
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.request.prompt_token_ids,
            outputs=completions,
            finished=self.finished,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=self.num_cached_tokens,
        )
