"""Mamba2's mixer (vLLM's `MambaMixer2`): a selective state-space layer over a state slot per
request.

Legend: T tokens, R request rows, D hidden, I intermediate (heads * head_dim), H heads, P
head_dim, G groups, N state size, K conv kernel width, C = I + 2 * G * N the conv channels,
S state slots (blocks).

One projection gives the gate z [I], the conv input xBC [C] and the step size dt [H]; xBC goes
through a causal depthwise conv (kernel K) and SiLU and splits into x [H, P], B [G, N] and
C [G, N]; the selective scan (vjx/mamba/ssd.py) gives y, which is normed with the gate
(x * silu(z), RMS within each of the G groups) and projected back to D.

The layer's cache is its state slots [S, (K - 1) * C + H * P * N] (`MambaSpec`): each row is
a request's last K - 1 conv inputs followed by its SSM state, in the cache dtype (vLLM's
default `mamba_ssm_cache_dtype="auto"`). A step gathers its rows' slots (row r's is its group
block table's first block), zeroes those of rows that start afresh (a new prompt, or a
recompute after preemption: no token before this step), runs the ops on the rows' states and
writes them back to the same slots (vjx/mamba/metadata.py), so a chunked prefill's next chunk
resumes where the last one stopped. Padding rows write nothing.

Under tensor parallelism the mixer's params and states are whole on every device (each runs
the layer on every head); splitting its heads as vLLM does is not built.
"""

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.kv_cache_interface import KVCacheSpec, MambaSpec
from vjx.mamba.causal_conv1d import causal_conv1d
from vjx.mamba.layernorm_gated import rms_norm_gated
from vjx.mamba.metadata import mamba_rows
from vjx.mamba.ssd import SsdInputs, ssd_scan
from vjx.models.layers.linear import INIT_STDDEV, Linear
from vjx.models.layers.param import HFParamLayer, logical_param


@dataclasses.dataclass(frozen=True)
class MambaArgs:
    """One Mamba2 mixer's shape; each family reads it from its own config fields."""

    hidden_size: int
    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    chunk_size: int
    use_bias: bool
    use_conv_bias: bool
    norm_eps: float
    time_step_limit: tuple[float, float] = (0.0, float("inf"))

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The slot's states: the conv's last K - 1 inputs, then the SSM state."""
        return ((self.conv_kernel - 1, self.conv_dim), (self.num_heads, self.head_dim, self.state_size))


class CausalConv1d(nnx.Module, HFParamLayer):
    """The depthwise conv's params: weight [K, C] (the checkpoint's torch Conv1d [C, 1, K],
    transposed at load) and bias [C]."""

    HF_NAMES = {"weight": "weight", "bias": "bias"}

    def __init__(self, channels: int, kernel_size: int, *, use_bias: bool, dtype, rngs: nnx.Rngs):
        weight = jnp.asarray(INIT_STDDEV, dtype) * nnx.initializers.normal(1.0)(
            rngs.params(), (kernel_size, channels), dtype
        )
        self.weight = logical_param(weight, (None, None))
        self.bias = logical_param(jnp.zeros((channels,), dtype), (None,)) if use_bias else None

    def to_param_layout(self, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        (tensor,) = tensors
        if attr == "weight":
            return tensor.reshape(tensor.shape[0], tensor.shape[-1]).T
        return tensor.reshape(getattr(self, attr).shape)


class GatedRMSNorm(nnx.Module, HFParamLayer):
    """Mamba2's `RMSNormGated` (norm after the gate), RMS within each group of `group_size`."""

    HF_NAMES = {"weight": "weight"}

    def __init__(self, num_features: int, *, group_size: int, eps: float, dtype):
        self.weight = logical_param(jnp.ones((num_features,), dtype), (None,))
        self.group_size = group_size
        self.eps = eps

    def __call__(self, x: Float[Array, "T I"], z: Float[Array, "T I"]) -> Float[Array, "T I"]:
        return rms_norm_gated(x, z, self.weight[...], group_size=self.group_size, eps=self.eps)


class MambaMixer2(nnx.Module, HFParamLayer):
    """in_proj -> causal conv -> selective scan -> gated norm -> out_proj, over state slots."""

    HF_NAMES = {"A_log": "A_log", "D": "D", "dt_bias": "dt_bias"}

    def __init__(self, args: MambaArgs, *, dtype, rngs: nnx.Rngs):
        D, inner, H = args.hidden_size, args.intermediate_size, args.num_heads
        self.in_proj = Linear(
            "TD,DE->TE", (D, inner + args.conv_dim + H), ("embed", None), use_bias=args.use_bias, dtype=dtype, rngs=rngs
        )
        self.conv1d = CausalConv1d(args.conv_dim, args.conv_kernel, use_bias=args.use_conv_bias, dtype=dtype, rngs=rngs)
        # Stand-ins until the checkpoint's: A = -exp(A_log) in [-H, -1], D = 1, dt = softplus(dt_bias) ~ 0.01.
        self.A_log = logical_param(jnp.log(jnp.arange(1, H + 1, dtype=jnp.float32)).astype(dtype), (None,))
        self.D = logical_param(jnp.ones((H,), dtype), (None,))
        self.dt_bias = logical_param(jnp.full((H,), -4.6, dtype), (None,))
        self.norm = GatedRMSNorm(inner, group_size=inner // args.n_groups, eps=args.norm_eps, dtype=dtype)
        self.out_proj = Linear("TI,ID->TD", (inner, D), (None, "embed"), use_bias=args.use_bias, dtype=dtype, rngs=rngs)
        self.args = args

    def __call__(
        self, x: Float[Array, "T D"], positions: Int[Array, " T"], kv_cache: Float[Array, "S L"], md: AttentionMetadata
    ) -> tuple[Float[Array, "T D"], Float[Array, "S L"]]:
        args = self.args
        inner, H, G, N = args.intermediate_size, args.num_heads, args.n_groups, args.state_size
        num_tokens = x.shape[0]
        z_TI, xBC_TC, dt_TH = jnp.split(self.in_proj(x), [inner, inner + args.conv_dim], axis=-1)
        rows = mamba_rows(md, num_tokens)
        conv_RKC, ssm_RHPN = self._split_states(rows.initial_states(kv_cache))
        conv_weight = self.conv1d.weight[...]
        conv_bias = None if self.conv1d.bias is None else self.conv1d.bias[...]
        xBC_TC, conv_RKC = causal_conv1d(xBC_TC, conv_weight, conv_bias, conv_RKC, md, activation="silu")
        x_TI, B_TGN, C_TGN = jnp.split(xBC_TC, [inner, inner + G * N], axis=-1)
        inputs = SsdInputs(
            x_THP=x_TI.reshape(num_tokens, H, args.head_dim),
            dt_TH=dt_TH,
            A_H=-jnp.exp(self.A_log[...].astype(jnp.float32)),
            B_TGN=B_TGN.reshape(num_tokens, G, N),
            C_TGN=C_TGN.reshape(num_tokens, G, N),
            D_H=self.D[...],
            dt_bias_H=self.dt_bias[...],
        )
        y_THP, ssm_RHPN = ssd_scan(inputs, ssm_RHPN, md, chunk_size=args.chunk_size, dt_limit=args.time_step_limit)
        y_TI = self.norm(y_THP.reshape(num_tokens, inner), z_TI)
        num_rows = conv_RKC.shape[0]
        states_RL = jnp.concatenate([conv_RKC.reshape(num_rows, -1), ssm_RHPN.reshape(num_rows, -1)], axis=-1)
        return self.out_proj(y_TI), rows.write_states(kv_cache, states_RL)

    def _split_states(self, states_RL: Float[Array, "R L"]) -> tuple[Float[Array, "R Km1 C"], Float[Array, "R H P N"]]:
        """A slot row's conv inputs and SSM state."""
        conv_shape, ssm_shape = self.args.state_shapes()
        conv_size, num_rows = int(np.prod(conv_shape)), states_RL.shape[0]
        return (
            states_RL[:, :conv_size].reshape(num_rows, *conv_shape),
            states_RL[:, conv_size:].reshape(num_rows, *ssm_shape),
        )

    def get_kv_cache_spec(self, block_size: int, num_kv_heads: int, dtype: str) -> KVCacheSpec:
        """The layer's state slots (`num_kv_heads` is not read)."""
        if dtype.startswith("float8"):
            raise ValueError("kv_cache_dtype='fp8' with a Mamba model is not built yet; use 'auto'.")
        return MambaSpec(block_size, self.args.state_shapes(), dtype)
