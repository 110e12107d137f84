"""Sampling parameters of one request, with vLLM's names, defaults and validation."""

import dataclasses
import enum

from vjx.validation import check_bool, check_float, check_int, check_int_list, check_str_list

_SAMPLING_EPS = 1e-5
_MIN_TEMPERATURE = 1e-2
"""A temperature in (0, 0.01) is raised to this, as vLLM does: smaller ones overflow float32
when the logits are divided by them."""
_MAX_TEMPERATURE = 2.0
_MAX_LOGIT_BIAS = 100.0
MAX_N = 1024
"""Completions one request may ask for: each is a request of its own in the engine."""
MAX_BAD_WORDS = 32
"""Token sequences (each bad word, with and without a leading space) one request may ban."""
MAX_BAD_WORD_TOKENS = 8
"""Tokens in one banned sequence."""
MAX_MIN_TOKENS_STOP_IDS = 16
"""Stop ids (EOS included) the step's table holds for a request below `min_tokens`; a
request with more has them banned through its logit bias row until it reaches min_tokens."""
_BOOLS = (
    "ignore_eos",
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
)


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclasses.dataclass
class StructuredOutputsParams:
    """What the output must match, as vLLM's: exactly one of `json` (a JSON schema, as a dict
    or its text), `regex`, `choice` (one of these strings), `grammar` (Lark, or GBNF as
    llama.cpp writes it), `json_object` (any JSON object) or `structural_tag` (llguidance's
    structural tag JSON). The other fields shape the JSON grammar."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        count = sum(getattr(self, name) is not None for name in _CONSTRAINTS)
        if count != 1:
            kind = "only one kind" if count > 1 else "one kind"
            raise ValueError(
                f"structured_outputs must use {kind} of constraint ({', '.join(_CONSTRAINTS)}), got "
                f"{ {name: getattr(self, name) for name in _CONSTRAINTS if getattr(self, name) is not None} }."
            )
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"structured_outputs.{name} must be a string, got {value!r}.")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError(f"structured_outputs.json must be a JSON schema (a dict or its text), got {self.json!r}.")
        if self.choice is not None:
            self.choice = check_str_list("structured_outputs.choice", self.choice)
            if not self.choice:
                raise ValueError("structured_outputs.choice must hold at least one string.")
        if self.json_object is not None:
            check_bool("structured_outputs.json_object", self.json_object)
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            check_bool(f"structured_outputs.{name}", getattr(self, name))


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
    structured_outputs: StructuredOutputsParams | None = None
    bad_words_token_ids: list[list[int]] | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    """Set by the engine's input processor: the token ids of each bad word."""

    def __post_init__(self) -> None:
        self.stop = check_str_list("stop", [] if self.stop is None else self.stop)
        self.stop_token_ids = check_int_list("stop_token_ids", self.stop_token_ids or [], 0)
        self.bad_words = check_str_list("bad_words", self.bad_words or [])
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = check_int_list("allowed_token_ids", self.allowed_token_ids)
        self.logit_bias = _clamped_logit_bias(self.logit_bias)
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got {self.structured_outputs!r}.")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}.")
        for name in _BOOLS:
            check_bool(name, getattr(self, name))
        self._verify_sampling()
        self._verify_stopping()
        self._verify_outputs()

    def _verify_sampling(self) -> None:
        self.n = check_int("n", self.n, 1, MAX_N)
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, check_float(name, getattr(self, name), -2.0, 2.0))
        self.repetition_penalty = check_float("repetition_penalty", self.repetition_penalty, 0.0, low_open=True)
        self.temperature = check_float("temperature", self.temperature, 0.0, _MAX_TEMPERATURE)
        if 0.0 < self.temperature < _MIN_TEMPERATURE:
            self.temperature = _MIN_TEMPERATURE
        self.top_p = check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        # Any k >= the vocabulary keeps every token, as vLLM reads it.
        self.top_k = check_int("top_k", self.top_k, -1)
        if self.top_k == -1:
            self.top_k = 0
        self.min_p = check_float("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            self.seed = check_int("seed", self.seed)
        if self.seed == -1:
            self.seed = None  # vLLM's "no seed"
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must not be empty (None allows every token).")
        if self.n > 1 and self.is_greedy:
            raise ValueError(f"n must be 1 when using greedy sampling (temperature=0), got n={self.n}.")

    def _verify_stopping(self) -> None:
        if self.max_tokens is not None:
            self.max_tokens = check_int("max_tokens", self.max_tokens, 1)
        self.min_tokens = check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}."
            )
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are only supported when detokenize is True.")

    def _verify_outputs(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is True:
                value = 1  # vLLM reads True as "the chosen token's logprob and 1 more".
            if value == -1:
                raise ValueError(f"{name}=-1 (the whole vocabulary) is more than max_logprobs allows.")
            if value is not None:
                setattr(self, name, check_int(name, value, 0))
        if self.truncate_prompt_tokens is not None:
            self.truncate_prompt_tokens = check_int("truncate_prompt_tokens", self.truncate_prompt_tokens, 1)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _SAMPLING_EPS


def _clamped_logit_bias(logit_bias) -> dict[int, float] | None:
    """Token id -> bias, each bias clamped to [-100, 100] as vLLM does (after the check that
    it is a finite number); the input processor checks the ids against the vocabulary. Keys
    are ints, as vLLM's SamplingParams takes them (the server converts the JSON strings)."""
    if logit_bias is None:
        return None
    if not isinstance(logit_bias, dict):
        raise ValueError(f"logit_bias must be a dict of token id -> bias, got {logit_bias!r}.")
    clamped = {}
    for token, bias in logit_bias.items():
        try:
            token_id = check_int("logit_bias", token)
        except ValueError:
            raise ValueError(f"logit_bias keys must be token ids, got {token!r}.") from None
        try:
            bias = check_float("logit_bias", bias)
        except ValueError:
            raise ValueError(f"logit_bias values must be finite numbers, got {bias!r} for token {token_id}.") from None
        clamped[token_id] = min(_MAX_LOGIT_BIAS, max(-_MAX_LOGIT_BIAS, bias))
    return clamped
