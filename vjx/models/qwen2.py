"""Qwen 2 / Qwen 2.5: Llama's blocks with biases on q, k and v (none on o), tied embeddings on
the small sizes, and sliding windows only on the layers `layer_types` marks."""

import dataclasses

from vjx.models.layers.attention import AttentionArgs
from vjx.models.layers.decoder import BuildContext
from vjx.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    def attention_args(self, ctx: BuildContext, layer_idx: int) -> AttentionArgs:
        return dataclasses.replace(super().attention_args(ctx, layer_idx), qkv_bias=True, o_bias=False)
