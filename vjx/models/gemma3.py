"""Gemma 3 (text): Gemma 2's blocks with a per-head (1 + w) RMSNorm of q and k instead of
attention soft-capping, five sliding-window layers to each global one (`layer_types`), and
RoPE per layer type (local base 10k; global base 1M, with the larger sizes' linear scaling).

The sliding-window layers form their own KV cache group, so the blocks that leave their
window are freed while the global layers keep every block. `Gemma3ForConditionalGeneration`
checkpoints (4B and up) run as the same text model: their language-model tensors are renamed
and the vision tower's skipped.
"""

import dataclasses

from vjx.models.gemma2 import Gemma2ForCausalLM
from vjx.models.layers.attention import Attention, AttentionArgs, QKNormAttention
from vjx.models.layers.decoder import BuildContext
from vjx.models.layers.norm import GemmaRMSNorm


class Gemma3Attention(QKNormAttention):
    NORM = GemmaRMSNorm


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    ATTENTION = Gemma3Attention

    def attention_args(self, ctx: BuildContext, layer_idx: int) -> AttentionArgs:
        return dataclasses.replace(super().attention_args(ctx, layer_idx), soft_cap=None)

    def make_attention(self, ctx: BuildContext, layer_idx: int) -> Attention:
        rotary = ctx.rotary(ctx.hf_config.layer_types[layer_idx])
        args = self.attention_args(ctx, layer_idx)
        return self.ATTENTION(args, rotary, dtype=ctx.dtype, backend=ctx.backend, rngs=ctx.rngs)


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    CHECKPOINT_PREFIXES = {
        "model.language_model.": "model.",
        "language_model.model.": "model.",
        "language_model.lm_head.": "lm_head.",
        "model.vision_tower.": None,
        "vision_tower.": None,
        "model.multi_modal_projector.": None,
        "multi_modal_projector.": None,
    }
