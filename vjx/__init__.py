"""vjx: vLLM's v1 engine on JAX/XLA."""

from vjx.beam_search import BeamSearchParams
from vjx.engine.async_llm import AsyncLLM
from vjx.engine_args import EngineArgs
from vjx.llm import LLM
from vjx.outputs import CompletionOutput, RequestOutput
from vjx.sampling_params import SamplingParams

__all__ = ["LLM", "AsyncLLM", "EngineArgs", "SamplingParams", "BeamSearchParams", "RequestOutput", "CompletionOutput"]
