"""One request's logprobs as users see them: `LogprobsLists` rows -> dicts of `Logprob`.

EngineCore sends each position as a row whose column 0 is the chosen token (the sampled
token, or for prompt logprobs the prompt token) and whose other columns are the top
candidates, best first. Each row becomes a dict {token id: Logprob}: the chosen token with
its own rank, the candidates with ranks 1, 2, ... . A chosen token that is also a candidate
appears once (the dict keeps its first place).
"""

from transformers import PreTrainedTokenizerBase

from vjx.engine.messages import EngineCoreRequest
from vjx.outputs import Logprob, LogprobsLists, PromptLogprobs, SampleLogprobs


class TokenDecoder:
    """Each token's text on its own, as vLLM shows candidates (no context, special tokens
    kept); decoded once per token id, since 20 candidates per token would otherwise cost
    more than the rest of the output processing."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def decode_each(self, token_ids: list[int]) -> list[str]:
        texts = self._texts
        for token_id in token_ids:
            if token_id not in texts:
                texts[token_id] = self.tokenizer.decode([token_id])
        return [texts[token_id] for token_id in token_ids]


class LogprobsProcessor:
    """Keeps one request's sample logprobs, prompt logprobs and cumulative logprob.

    `logprobs` and `cumulative_logprob` are None unless the request asked for `logprobs`;
    `prompt_logprobs` is None unless it asked for `prompt_logprobs`, then `[None]` plus one
    dict per later prompt token once they arrive. Decoded tokens are None when the request
    does not detokenize.
    """

    def __init__(
        self,
        token_decoder: TokenDecoder | None,
        num_logprobs: int | None,
        num_prompt_logprobs: int | None,
    ):
        self.token_decoder = token_decoder
        self.num_logprobs = num_logprobs
        self.num_prompt_logprobs = num_prompt_logprobs
        self.logprobs: SampleLogprobs | None = None if num_logprobs is None else []
        self.cumulative_logprob: float | None = None if num_logprobs is None else 0.0
        self.prompt_logprobs: PromptLogprobs | None = None

    @classmethod
    def from_new_request(cls, token_decoder: TokenDecoder, request: EngineCoreRequest) -> "LogprobsProcessor":
        params = request.sampling_params
        return cls(token_decoder if params.detokenize else None, params.logprobs, params.prompt_logprobs)

    def update_sample_logprobs(self, lists: LogprobsLists | None, num_tokens: int) -> None:
        """Appends the first `num_tokens` rows: the tokens the output keeps (a stop string
        drops the tokens after the one that completed it)."""
        if self.num_logprobs is None or lists is None:
            return
        for i in range(min(num_tokens, len(lists.sampled_token_ranks))):
            self.cumulative_logprob += lists.logprobs[i][0]
            self.logprobs.append(self._make_dict(lists, i, self.num_logprobs))

    def update_prompt_logprobs(self, lists: LogprobsLists | None) -> None:
        """Appends prompt positions (the first one has no logprob: it starts with None)."""
        if self.num_prompt_logprobs is None or lists is None:
            return
        if self.prompt_logprobs is None:
            self.prompt_logprobs = [None]
        for i in range(len(lists.sampled_token_ranks)):
            self.prompt_logprobs.append(self._make_dict(lists, i, self.num_prompt_logprobs))

    def pop_prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt logprobs not handed out yet, forgotten here (for DELTA outputs)."""
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs:
            self.prompt_logprobs = []
        return prompt_logprobs

    def _make_dict(self, lists: LogprobsLists, row: int, num_candidates: int) -> dict[int, Logprob]:
        """Row `row` as {token id: Logprob}: the chosen token, then `num_candidates` more."""
        token_ids = lists.logprob_token_ids[row][: num_candidates + 1]
        logprobs = lists.logprobs[row][: num_candidates + 1]
        ranks = [lists.sampled_token_ranks[row], *range(1, len(token_ids))]
        decoded = self.token_decoder.decode_each(token_ids) if self.token_decoder else [None] * len(token_ids)
        result: dict[int, Logprob] = {}
        for token_id, logprob, rank, text in zip(token_ids, logprobs, ranks, decoded):
            result.setdefault(token_id, Logprob(logprob, rank, text))
        return result
