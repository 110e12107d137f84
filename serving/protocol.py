"""The OpenAI API's request and response bodies (and vLLM's extra request fields), as
pydantic models.

Requests are validated strictly from JSON (`parse_request`): a string where a number
belongs is an error, not a conversion. Unknown fields are kept aside (`model_extra`) and
ignored, as vLLM does, except those serving/unsupported_fields.py refuses. Ranges that
depend on the engine or the server's limits (max_logprobs, max_model_len, --max-n, ...)
are checked by the handlers.
"""

import time
import uuid
from typing import Literal, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field

MAX_LOGPROBS = 20
"""Most top logprobs per token the OpenAI API allows."""
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class RequestModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(RequestModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's: every chunk carries the usage so far (with `include_usage`)."""


class JsonSchema(RequestModel):
    name: str | None = None
    description: str | None = None
    json_schema: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None
    """Always honoured: the output follows the schema whatever `strict` says (as vLLM)."""


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class SamplingRequest(RequestModel):
    """The fields completions and chat completions share (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    n: int = Field(1, ge=1)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=_INT64_MIN, le=_INT64_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    """Which end `truncate_prompt_tokens` cuts: "left" (the default) keeps the last tokens."""
    priority: int = 0
    cache_salt: str | None = None
    request_id: str | None = Field(None, max_length=256)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    return_token_ids: bool = False
    """vLLM's: each choice carries its `token_ids` and the prompt's `prompt_token_ids`."""
    return_tokens_as_token_ids: bool = False
    """vLLM's: logprob tokens read "token_id:N" (for tokens that are not valid UTF-8 alone)."""
    response_format: ResponseFormat | None = None
    """OpenAI's: text, json_object or json_schema (serving/structured_outputs.py)."""
    structured_outputs: dict | None = None
    """vLLM's: `StructuredOutputsParams` fields (json, regex, choice, grammar, json_object, ...)."""

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def include_continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class TextContentPart(RequestModel):
    type: Literal["text"]
    text: str


class ChatMessage(RequestModel):
    role: str
    """Any role, as vLLM: the chat template decides what it makes of it."""
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None
    """An assistant message's calls, as a reply gave them (OpenAI's format)."""
    tool_call_id: str | None = None
    """A `tool` message's: the call it answers."""
    reasoning: str | None = None
    """An assistant message's reasoning (vLLM's; `reasoning_content` is its old name)."""


class FunctionDefinition(RequestModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict | None = None
    """The arguments' JSON schema."""
    strict: bool | None = None


class ChatCompletionToolsParam(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(RequestModel):
    name: str


class ChatCompletionNamedToolChoiceParam(RequestModel):
    """`tool_choice` naming the one function to call."""

    function: ChatCompletionNamedFunction
    type: Literal["function"] = "function"


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    """Deprecated by the OpenAI API in favour of `max_completion_tokens`; still honoured."""
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    """vLLM's: each reply starts with the last message's content when that message is the
    reply's role."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    chat_template: str | None = None
    """vLLM's: this request's template instead of the server's (--trust-request-chat-template)."""
    chat_template_kwargs: dict | None = None
    """vLLM's: extra variables for the template (e.g. enable_thinking)."""
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam | None = None
    """None: "auto" when `tools` are given, else "none" (OpenAI's defaults)."""
    parallel_tool_calls: bool | None = True
    """False keeps only a reply's first tool call (and `required` asks for one)."""
    include_reasoning: bool = True
    """vLLM's: with a reasoning parser, whether replies carry the reasoning."""

    @property
    def effective_tool_choice(self) -> str | ChatCompletionNamedToolChoiceParam:
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice


class TokenizeRequest(RequestModel):
    """Either `prompt` (a completion's text) or `messages` (a chat, through its template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[ChatCompletionToolsParam] | None = None
    """The tools a chat's template renders."""

    @pydantic.model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt and messages must be given")
        return self


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int]


class LoadLoRAAdapterRequest(RequestModel):
    """vLLM's `/v1/load_lora_adapter` body; `load_inplace` replaces an adapter of that name."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(RequestModel):
    """vLLM's `/v1/unload_lora_adapter` body: the adapter's name, or the id it was given."""

    lora_name: str | None = None
    lora_int_id: int | None = None


ModelT = TypeVar("ModelT", bound=RequestModel)


def parse_request(model_class: type[ModelT], body: bytes) -> ModelT:
    """Validates a JSON body; raises `UnicodeDecodeError` or `pydantic.ValidationError`."""
    return model_class.model_validate_json(body.decode("utf-8"))


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptTokenUsageInfo(ResponseModel):
    cached_tokens: int | None = None
    """Prompt tokens whose KV came from the prefix cache."""


class UsageInfo(ResponseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None
    """With --enable-prompt-tokens-details (vLLM's flag)."""

    @classmethod
    def of(
        cls, num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int | None = None
    ) -> "UsageInfo":
        """`num_cached_tokens`: None leaves out prompt_tokens_details."""
        details = None if num_cached_tokens is None else PromptTokenUsageInfo(cached_tokens=num_cached_tokens)
        return cls(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=num_completion_tokens,
            total_tokens=num_prompt_tokens + num_completion_tokens,
            prompt_tokens_details=details,
        )


class SpeculativeDecodingMetrics(ResponseModel):
    """vLLM's per-request speculative decoding figures (`RequestSpecDecodeMetrics.to_dict`);
    experimental in vLLM, so their shape may change with it."""

    mean_acceptance_length: float
    """Tokens kept per verify step, the bonus token included."""
    draft_acceptance_rate: float
    acceptance_histogram: list[int]
    """Entry j: the verify steps that accepted exactly j drafts (num_spec_tokens + 1 entries)."""
    num_spec_steps: int
    num_accepted_draft_tokens: int
    num_draft_tokens: int
    num_spec_tokens: int
    per_step_accepted: list[int] | None = None
    """Each verify step's accepted drafts, in order (--per-request-spec-decode-metrics detailed)."""
    per_step_drafted: list[int] | None = None


class PerRequestMetrics(ResponseModel):
    """A response's `metrics` (vLLM's; vjx has its speculative decoding part), for a request of
    one sequence: one prompt and n = 1."""

    speculative_decoding: SpeculativeDecodingMetrics | None = None


class PromptLogprob(ResponseModel):
    """vLLM's `Logprob` in a response's `prompt_logprobs`."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]
"""Per prompt token, its candidates by token id (None for the first token)."""


class CompletionLogProbs(ResponseModel):
    """The legacy completions format: one entry per token in each list."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(ResponseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None
    metrics: PerRequestMetrics | None = None
    """With --per-request-spec-decode-metrics; a stream's usage chunk carries it."""


class ChatTopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(ResponseModel):
    content: list[ChatTokenLogprob] | None = None


def make_tool_call_id() -> str:
    return random_id("chatcmpl-tool")


class FunctionCall(ResponseModel):
    name: str
    arguments: str
    """A JSON object, as text."""


class ToolCall(ResponseModel):
    id: str = Field(default_factory=make_tool_call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageOut(ResponseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None
    """vLLM's: the reasoning, with --reasoning-parser."""
    tool_calls: list[ToolCall] = Field(default_factory=list)

    @pydantic.model_serializer(mode="wrap")
    def _drop_no_tool_calls(self, handler) -> dict:
        """vLLM's: `tool_calls` only when there are some."""
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        return data


class ChatCompletionResponseChoice(ResponseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    metrics: PerRequestMetrics | None = None
    """With --per-request-spec-decode-metrics."""


class DeltaFunctionCall(ResponseModel):
    name: str | None = None
    arguments: str | None = None

    @pydantic.model_serializer(mode="wrap")
    def _drop_none(self, handler) -> dict:
        return {key: value for key, value in handler(self).items() if value is not None}


class DeltaToolCall(ResponseModel):
    """A piece of tool call `index`: its first carries the id, type and name, later ones
    more of the arguments' text."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None

    @pydantic.model_serializer(mode="wrap")
    def _drop_none(self, handler) -> dict:
        return {key: value for key, value in handler(self).items() if value is not None}


class DeltaMessage(ResponseModel):
    """Only the fields a chunk changes: the role once, then content, reasoning (vLLM's) and
    tool-call pieces."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @pydantic.model_serializer(mode="wrap")
    def _drop_none(self, handler) -> dict:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatCompletionStreamChoice(ResponseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None
    metrics: PerRequestMetrics | None = None
    """With --per-request-spec-decode-metrics, on the usage chunk."""


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vjx"
    root: str | None = None
    parent: str | None = None
    """A LoRA adapter's base model."""
    max_model_len: int | None = None


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
