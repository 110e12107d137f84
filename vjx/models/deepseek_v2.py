"""DeepSeek-V2 and V3 (and V2-Lite, R1): multi-head latent attention over a latent KV cache
(vjx/models/layers/mla_attention.py) and, past the first `first_k_dense_replace` layers,
DeepSeek's sparse MoE block with shared experts (vjx/models/layers/deepseek_moe.py); Llama's
pre-norm layers otherwise. V2 always lays its rotary pairs out interleaved, V3 when
`rope_interleave` says so.

Of quantized checkpoints, vjx loads block-wise FP8 (DeepSeek-V3's and R1's own format), whose
kv_b_proj MLA dequantizes at load (vjx/models/layers/mla_attention.py); other schemes are
refused, since nothing checks they leave kv_b_proj's kernel readable."""

from typing import Any, ClassVar

from flax import nnx

from vjx.models.layers.decoder import BuildContext
from vjx.models.layers.deepseek_moe import deepseek_moe_block, is_moe_layer
from vjx.models.layers.mla_attention import MLAArgs, MLAAttention
from vjx.models.layers.rotary import RotaryEmbedding
from vjx.models.llama import LlamaForCausalLM


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    ROPE_INTERLEAVE_DEFAULT: ClassVar[bool] = True
    """Whether the rotary pairs are interleaved when the config does not say (V2: always)."""

    def make_attention(self, ctx: BuildContext, layer_idx: int) -> MLAAttention:
        hf_config = ctx.hf_config
        check_quantization(hf_config)
        interleave = getattr(hf_config, "rope_interleave", None)
        args = MLAArgs.from_hf_config(
            hf_config, rope_interleave=self.ROPE_INTERLEAVE_DEFAULT if interleave is None else interleave
        )
        rotary = RotaryEmbedding.from_hf_config(hf_config, args.qk_rope_head_dim, max_model_len=ctx.max_model_len)
        return MLAAttention(args, rotary, dtype=ctx.dtype, rngs=ctx.rngs)

    def make_mlp(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        if is_moe_layer(ctx.hf_config, layer_idx):
            return deepseek_moe_block(ctx)
        return super().make_mlp(ctx, layer_idx)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    ROPE_INTERLEAVE_DEFAULT = False
    # V3's and R1's checkpoints (61 layers) store the multi-token-prediction layer as layer
    # 61, which only `mtp` speculation (not built) reads.
    CHECKPOINT_PREFIXES = {"model.layers.61.": None}


def check_quantization(hf_config: Any) -> None:
    """Refuses a quantized checkpoint other than block-wise FP8 (`quant_method` "fp8" with
    `weight_block_size`). Quantizing at load (`quantization="fp8"` / `"ptpc_fp8"`) leaves
    kv_b_proj in the model dtype and needs no check here."""
    config = dict(getattr(hf_config, "quantization_config", None) or {})
    method, block = config.get("quant_method"), config.get("weight_block_size")
    if config and (method != "fp8" or not block):
        raise ValueError(
            "vjx loads quantized DeepSeek checkpoints in block-wise FP8 only (quant_method 'fp8' with "
            f"weight_block_size, as DeepSeek-V3 ships); this one has quant_method {method!r}"
            f"{'' if block else ' without weight_block_size'}. Per-tensor FP8, AWQ, GPTQ, compressed-tensors and "
            "MXFP4 DeepSeek checkpoints are not built: MLA reads kv_b_proj's kernel as plain weights."
        )
