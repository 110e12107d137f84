"""vLLM's `vllm.utils` paths that user scripts import."""
