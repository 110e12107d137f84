"""Sampling parameters of one request, with vLLM's names, defaults and validation."""

import dataclasses
import enum

_SAMPLING_EPS = 1e-5
_MAX_LOGIT_BIAS = 100.0
MAX_BAD_WORDS = 32
"""Token sequences (each bad word, with and without a leading space) one request may ban."""
MAX_BAD_WORD_TOKENS = 8
"""Tokens in one banned sequence."""
MAX_MIN_TOKENS_STOP_IDS = 16
"""Stop ids (EOS included) the step can hold back while a request is below `min_tokens`."""


class RequestOutputKind(enum.Enum):
    """What each `RequestOutput` of a request holds while it runs."""

    CUMULATIVE = 0
    """All text and tokens so far (`LLM.generate`'s default)."""
    DELTA = 1
    """Only what is new since the last output (streaming)."""
    FINAL_ONLY = 2
    """Nothing until the request finishes."""


@dataclasses.dataclass
class SamplingParams:
    """How to pick each output token and when to stop.

    `temperature=0` means greedy. `top_k=0` (or -1), `top_p=1` and `min_p=0` mean "off", as
    in vLLM. A request with `seed` set samples the same tokens whatever else is in the batch.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    bad_words_token_ids: list[list[int]] | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    """Set by the engine's input processor: the token ids of each bad word."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        if self.logit_bias is not None:
            self.logit_bias = {
                int(token): min(_MAX_LOGIT_BIAS, max(-_MAX_LOGIT_BIAS, float(bias)))
                for token, bias in self.logit_bias.items()
            }
        if self.top_k == -1:
            self.top_k = 0
        self._verify_sampling()
        self._verify_stopping()
        self._verify_outputs()

    def _verify_sampling(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must not be empty (None allows every token).")

    def _verify_stopping(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}."
            )
        if any(not s for s in self.stop):
            raise ValueError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True.")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}.")
        if self.min_tokens and len(self.stop_token_ids) > MAX_MIN_TOKENS_STOP_IDS - 1:
            raise ValueError(
                f"stop_token_ids may hold at most {MAX_MIN_TOKENS_STOP_IDS - 1} ids when min_tokens > 0, "
                f"got {len(self.stop_token_ids)}."
            )

    def _verify_outputs(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be non-negative, got {value}.")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}.")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS
