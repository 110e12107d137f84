"""gpt-oss: Llama's pre-norm blocks with biases on q/k/v/o, attention sinks, YaRN RoPE,
sliding-window (128) and full layers alternating as `layer_types` says, and a sparse MoE
block in every layer: a router with a bias (top-k of the logits, then their softmax) and
experts with biases and the clamped SwiGLU ("swigluoai").

The checkpoint names the router `mlp.router` and stores the experts fused: `gate_up_proj`
[E, D, 2F] with gate and up interleaved along the last dimension (gate at even columns),
`gate_up_proj_bias` [E, 2F], `down_proj` [E, F, D], `down_proj_bias` [E, D]. OpenAI's own
checkpoints store the two projections in MXFP4 (vjx/quantization/mxfp4.py).

Legend: E experts, D hidden, F expert width.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
from flax import nnx

from vjx.models.layers.activation import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from vjx.models.layers.attention import AttentionArgs
from vjx.models.layers.decoder import BuildContext
from vjx.models.layers.fused_moe import FusedMoE
from vjx.models.layers.moe_block import SparseMoeBlock, moe_args
from vjx.models.layers.param import HFTensor
from vjx.models.llama import LlamaForCausalLM


class GptOssExperts(FusedMoE):
    """FusedMoE filled from gpt-oss's fused expert tensors."""

    HF_TENSORS = {
        "gate_up_proj": "w13",
        "gate_up_proj_bias": "w13_bias",
        "down_proj": "w2",
        "down_proj_bias": "w2_bias",
    }

    def checkpoint_tensors(self, path: Sequence[str]) -> dict[str, HFTensor]:
        prefix = ".".join(path)
        return {f"{prefix}.{name}": HFTensor(attr) for name, attr in self.HF_TENSORS.items()}

    def checkpoint_layout(self, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        """[E, D, 2F] -> w13 [E, D, 2, F] and [E, 2F] -> w13_bias [E, 2, F] (gate at the even
        columns); w2 and its bias keep their layout."""
        (tensor,) = tensors
        if attr in ("w13", "w13_bias"):
            *lead, double_width = tensor.shape
            return np.swapaxes(tensor.reshape(*lead, double_width // 2, 2), -1, -2)
        return tensor


def _check_swiglu(hf_config) -> None:
    """vjx's "swigluoai" has gpt-oss's constants; a config with others is refused."""
    for name, value in (("swiglu_alpha", SWIGLU_OAI_ALPHA), ("swiglu_limit", SWIGLU_OAI_LIMIT)):
        if getattr(hf_config, name, value) != value:
            raise ValueError(f"{name} must be {value} (gpt-oss's), got {getattr(hf_config, name)}.")


class GptOssForCausalLM(LlamaForCausalLM):
    CHECKPOINT_SUBSTRINGS = {".mlp.router.": ".mlp.gate."}

    def __init__(self, hf_config, **kwargs):
        _check_swiglu(hf_config.get_text_config())
        super().__init__(hf_config, **kwargs)

    def attention_args(self, ctx: BuildContext, layer_idx: int) -> AttentionArgs:
        return dataclasses.replace(super().attention_args(ctx, layer_idx), sinks=True)

    def make_mlp(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        args = moe_args(
            ctx, intermediate_size=ctx.args.intermediate_size, renormalize=True, activation="swigluoai", use_bias=True
        )
        experts = GptOssExperts(args, dtype=ctx.dtype, rngs=ctx.rngs)
        return SparseMoeBlock(args, experts=experts, dtype=ctx.dtype, rngs=ctx.rngs)
