"""vLLM's import path for the engine arguments (`vllm.engine.arg_utils`)."""

from vjx.engine_args import AsyncEngineArgs, EngineArgs

__all__ = ["EngineArgs", "AsyncEngineArgs"]
