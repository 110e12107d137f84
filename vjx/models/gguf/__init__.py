"""GGUF import: llama.cpp GGUF files -> Hugging Face model directories (see `convert`)."""

from vjx.models.gguf.convert import convert_gguf_to_hf

__all__ = ["convert_gguf_to_hf"]
