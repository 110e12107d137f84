"""The gated MLP of every dense family: down(act(gate(x)) * up(x)), gate and up in one GEMM.

Legend: T tokens, D hidden, F MLP width.
"""

from flax import nnx
from jaxtyping import Array, Float

from vjx.models.layers.activation import ACTIVATIONS, check_activation
from vjx.models.layers.linear import Linear, MergedLinear


class GatedMLP(nnx.Module):
    """SwiGLU / GeGLU by `hidden_act`; the checkpoint's `gate_proj` and `up_proj` fill the
    fused `gate_up_proj`."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str, *, use_bias: bool, dtype, rngs):
        D, F = hidden_size, intermediate_size
        kwargs = dict(use_bias=use_bias, dtype=dtype, rngs=rngs)
        self.gate_up_proj = self.make_gate_up_proj(D, F, **kwargs)
        self.down_proj = Linear("TF,FD->TD", (F, D), ("mlp", "embed"), **kwargs)
        self.hidden_act = check_activation(hidden_act)

    def make_gate_up_proj(self, hidden_size: int, intermediate_size: int, **kwargs) -> MergedLinear:
        """The gate/up GEMM; the one hook for checkpoints that store it differently."""
        return MergedLinear(("gate_proj", "up_proj"), hidden_size, intermediate_size, ("embed", "mlp"), **kwargs)

    def __call__(self, x: Float[Array, "T D"]) -> Float[Array, "T D"]:
        gate_TF, up_TF = self.gate_up_proj(x)
        return self.down_proj(ACTIVATIONS[self.hidden_act](gate_TF) * up_TF)
