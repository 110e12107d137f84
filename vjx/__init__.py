"""vjx: vLLM's v1 engine on JAX/XLA, under vLLM's names."""

from vjx.beam_search import BeamSearchParams
from vjx.engine.async_llm import AsyncLLM
from vjx.engine.llm_engine import LLMEngine
from vjx.engine_args import AsyncEngineArgs, EngineArgs
from vjx.inputs import PromptType, TextPrompt, TokensPrompt
from vjx.llm import LLM
from vjx.outputs import CompletionOutput, RequestOutput
from vjx.sampling_params import RequestOutputKind, SamplingParams

AsyncLLMEngine = AsyncLLM
"""vLLM's older name of the asynchronous engine."""

__all__ = [
    "LLM",
    "LLMEngine",
    "AsyncLLM",
    "AsyncLLMEngine",
    "EngineArgs",
    "AsyncEngineArgs",
    "SamplingParams",
    "RequestOutputKind",
    "BeamSearchParams",
    "RequestOutput",
    "CompletionOutput",
    "PromptType",
    "TextPrompt",
    "TokensPrompt",
]
