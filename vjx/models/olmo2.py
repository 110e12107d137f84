"""OLMo 2: norms after each branch instead of before it (x + norm(attn(x)), then
x + norm(mlp(x))), and q and k RMS-normalized over their whole projection (all heads at once,
not per head) before RoPE.

Legend: T tokens, D hidden, N query heads, K kv heads, H head dim.
"""

from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.models.layers.attention import Attention, AttentionArgs
from vjx.models.layers.decoder import BuildContext, DecoderArgs
from vjx.models.layers.mlp import GatedMLP
from vjx.models.layers.norm import RMSNorm
from vjx.models.layers.rotary import RotaryEmbedding
from vjx.models.llama import LlamaForCausalLM


class Olmo2Attention(Attention):
    """q_norm [N, H] and k_norm [K, H] span every head, so under tensor parallelism the mean
    of squares is reduced over the devices' heads."""

    def __init__(self, args: AttentionArgs, rotary: RotaryEmbedding, *, dtype, backend, rngs):
        super().__init__(args, rotary, dtype=dtype, backend=backend, rngs=rngs)
        N, K, H, eps = args.num_heads, args.num_kv_heads, args.head_dim, args.rms_norm_eps
        self.q_norm = RMSNorm(N * H, eps=eps, dtype=dtype, shape=(N, H), logical_axes=("heads", "head_dim"))
        self.k_norm = RMSNorm(K * H, eps=eps, dtype=dtype, shape=(K, H), logical_axes=("kv_heads", "head_dim"))

    def normalize_qk(
        self, q_TNH: Float[Array, "T N H"], k_TKH: Float[Array, "T K H"]
    ) -> tuple[Float[Array, "T N H"], Float[Array, "T K H"]]:
        return self.q_norm(q_TNH), self.k_norm(k_TKH)


class Olmo2DecoderLayer(nnx.Module):
    """Post-norm block: x + norm(attn(x)), then x + norm(mlp(x))."""

    def __init__(self, args: DecoderArgs, self_attn: Attention, mlp: GatedMLP, *, dtype):
        eps = args.rms_norm_eps
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(args.hidden_size, eps=eps, dtype=dtype)
        self.mlp = mlp
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, eps=eps, dtype=dtype)

    def __call__(
        self,
        x: Float[Array, "T D"],
        positions: Int[Array, " T"],
        kv_cache: Array,
        md: AttentionMetadata,
    ) -> tuple[Float[Array, "T D"], Array]:
        attn_out, kv_cache = self.self_attn(x, positions, kv_cache, md)
        x = x + self.post_attention_layernorm(attn_out)
        x = x + self.post_feedforward_layernorm(self.mlp(x))
        return x, kv_cache


class Olmo2ForCausalLM(LlamaForCausalLM):
    ATTENTION = Olmo2Attention

    def make_layer(self, ctx: BuildContext, layer_idx: int) -> nnx.Module:
        attention, mlp = self.make_attention(ctx, layer_idx), self.make_mlp(ctx, layer_idx)
        return Olmo2DecoderLayer(ctx.args, attention, mlp, dtype=ctx.dtype)
