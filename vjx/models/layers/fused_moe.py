"""vLLM's fused mixture-of-experts layer: routing, the experts' two grouped GEMMs, the
weighted sum of each token's experts.

Legend: T tokens, D hidden, E experts, K experts per token, F expert MLP width, M = T * K
(token, expert) pairs.

The router picks each token's K experts in float32 (`select_experts`). The pairs are then
sorted by expert, so each expert's rows are contiguous, and `jax.lax.ragged_dot` runs every
expert's gate/up GEMM in one call and every down GEMM in another (rows past the local experts'
groups come out zero). The outputs go back to token order and are summed with the routing
weights: no capacity factor, every token reaches all of its experts. A step with fewer pairs
than experts (decode) instead gathers each pair's expert weights: `ragged_dot` reads every
expert (and on CPU computes every group densely: 30x slower at one token, benchmarks/moe.py).

Tensor parallelism splits each expert's width F over the `model` devices, like a dense MLP;
expert parallelism (vLLM's `enable_expert_parallel`) instead gives each device whole experts
(logical axis `experts`). Either way the residual stream is whole on every device, so each
device routes every token itself, runs its share of the work on its own weights inside a
`shard_map`, and one all-reduce sums the devices' partial outputs (vLLM's all-gather /
reduce-scatter form of expert parallelism; an all-to-all would only pay once tokens are split
over devices).
"""

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int

from vjx.models.layers.activation import GATED_ACTIVATIONS, check_gated_activation
from vjx.models.layers.linear import INIT_STDDEV
from vjx.models.layers.param import HFParamLayer, HFTensor, logical_axes_of, logical_param
from vjx.quantization.base import FusedMoEMethod, UnquantizedFusedMoEMethod
from vjx.sharding.constraints import mesh_spec


@dataclasses.dataclass(frozen=True)
class MoEArgs:
    """One MoE layer's shape and routing, as the family's config gives them."""

    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    """Each expert's MLP width F."""
    renormalize: bool
    """The K routing weights are rescaled to sum to 1 (Mixtral; Qwen's `norm_topk_prob`)."""
    activation: str = "silu"
    """A `GATED_ACTIVATIONS` name: act(gate) * up, or gpt-oss's clamped "swigluoai"."""
    use_bias: bool = False
    """Biases on the experts' projections and on the router (gpt-oss)."""
    expert_parallel: bool = False
    """Whole experts per device (vLLM's `enable_expert_parallel`); else each expert's width
    is split over the `model` devices."""


def select_experts(
    router_logits: Float[Array, "T E"], top_k: int, *, renormalize: bool
) -> tuple[Float[Array, "T K"], Int[Array, "T K"]]:
    """Each token's `top_k` experts (ties go to the lower index) and their float32 weights:
    the softmax over all experts at them, rescaled to sum to 1 with `renormalize` (which is
    also the softmax over the top-k logits alone, gpt-oss's rule)."""
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    weights, ids = jax.lax.top_k(probs, top_k)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, ids.astype(jnp.int32)


class Router(nnx.Module, HFParamLayer):
    """The gate: logits [T, E] = x @ weight.T (+ bias), in float32. Never quantized."""

    HF_NAMES = {"weight": "weight", "bias": "bias"}

    def __init__(self, hidden_size: int, num_experts: int, *, use_bias: bool, dtype, rngs):
        weight = jax.random.normal(rngs.params(), (num_experts, hidden_size), dtype) * jnp.asarray(INIT_STDDEV, dtype)
        self.weight = logical_param(weight, (None, "embed"))
        self.bias = logical_param(jnp.zeros((num_experts,), dtype), (None,)) if use_bias else None

    def __call__(self, x: Float[Array, "T D"]) -> Float[Array, "T E"]:
        logits = jnp.dot(x.astype(jnp.float32), self.weight[...].astype(jnp.float32).T)
        return logits if self.bias is None else logits + self.bias[...].astype(jnp.float32)


class FusedMoE(nnx.Module, HFParamLayer):
    """The experts of one layer: w13 [E, D, 2, F] (gate, up), w2 [E, F, D], and with
    `use_bias` w13_bias [E, 2, F] and w2_bias [E, D].

    The checkpoint stores each expert as its own modules beside this one's path
    (`experts.{e}.{gate}`, `.{up}`, `.{down}`, torch layout [out, in]); `EXPERT_PARTS` names
    them, and a family whose checkpoint stores the experts otherwise overrides
    `checkpoint_tensors` and `checkpoint_layout`. The quantization method (vLLM's
    `FusedMoEMethodBase`; unquantized by default) may rename those tensors, store the
    weights otherwise (w13_scale [E, 2, F] and w2_scale [E, D] with FP8 weights, or block
    scales w13_scale_inv [E, D / k, 2, F] and w2_scale_inv [E, F / k, D]) and turn the tensors
    it loads into the unquantized layout first."""

    EXPERT_PARTS: Sequence[str] = ("gate_proj", "up_proj", "down_proj")
    quant_method: FusedMoEMethod = UnquantizedFusedMoEMethod()

    def __init__(self, args: MoEArgs, *, expert_parts: Sequence[str] | None = None, dtype, rngs):
        E, D, F = args.num_experts, args.hidden_size, args.intermediate_size
        if expert_parts is not None:
            self.EXPERT_PARTS = tuple(expert_parts)
        expert_axis, width_axis = ("experts", None) if args.expert_parallel else (None, "mlp")
        stddev = jnp.asarray(INIT_STDDEV, dtype)
        self.w13 = logical_param(
            jax.random.normal(rngs.params(), (E, D, 2, F), dtype) * stddev, (expert_axis, "embed", None, width_axis)
        )
        self.w2 = logical_param(
            jax.random.normal(rngs.params(), (E, F, D), dtype) * stddev, (expert_axis, width_axis, "embed")
        )
        self.w13_bias = (
            logical_param(jnp.zeros((E, 2, F), dtype), (expert_axis, None, width_axis)) if args.use_bias else None
        )
        self.w2_bias = logical_param(jnp.zeros((E, D), dtype), (expert_axis, "embed")) if args.use_bias else None
        self.top_k = args.top_k
        self.renormalize = args.renormalize
        self.activation = check_gated_activation(args.activation)
        self.expert_parallel = args.expert_parallel

    def hf_tensors(self, path: Sequence[str]) -> dict[str, HFTensor]:
        return self.quant_method.hf_tensors(self, self.checkpoint_tensors(path))

    def to_param_layout(self, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        return self.quant_method.to_param_layout(self, attr, tensors)

    def checkpoint_tensors(self, path: Sequence[str]) -> dict[str, HFTensor]:
        """The unquantized checkpoint's expert tensors, by full name."""
        gate, up, down = self.EXPERT_PARTS
        prefix = ".".join(path)
        num_experts = self.w13.shape[0]
        tensors = {}
        for e in range(num_experts):
            tensors[f"{prefix}.{e}.{gate}.weight"] = HFTensor("w13", 2 * e, 2 * num_experts)
            tensors[f"{prefix}.{e}.{up}.weight"] = HFTensor("w13", 2 * e + 1, 2 * num_experts)
            tensors[f"{prefix}.{e}.{down}.weight"] = HFTensor("w2", e, num_experts)
        return tensors

    def checkpoint_layout(self, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        """Per-expert torch weights [out, in] -> w13 [E, D, 2, F] or w2 [E, F, D]."""
        stacked = np.stack(tensors)
        if attr == "w13":
            num_experts, width, hidden = self.w13.shape[0], stacked.shape[1], stacked.shape[2]
            return stacked.reshape(num_experts, 2, width, hidden).transpose(0, 3, 1, 2)
        return stacked.transpose(0, 2, 1)

    def __call__(self, x: Float[Array, "T D"], router_logits: Float[Array, "T E"]) -> Float[Array, "T D"]:
        weights_TK, ids_TK = select_experts(router_logits, self.top_k, renormalize=self.renormalize)
        return self.forward_routed(x, weights_TK, ids_TK)

    def forward_routed(
        self, x: Float[Array, "T D"], weights_TK: Float[Array, "T K"], ids_TK: Int[Array, "T K"]
    ) -> Float[Array, "T D"]:
        """The experts' output for routing a block chose itself (DeepSeek's grouped top-k):
        each token's K experts `ids_TK`, weighted by `weights_TK` (float32)."""
        params = {name: getattr(self, name) for name in _GEMM_PARAMS if getattr(self, name, None) is not None}
        out_TD = _sharded_experts(
            x, weights_TK, ids_TK, params, activation=self.activation, expert_parallel=self.expert_parallel
        )
        if self.w2_bias is not None:
            # Added once, after the devices' partial sums: each pair's down bias, weighted.
            bias_TKD = jnp.take(self.w2_bias[...], ids_TK, axis=0).astype(jnp.float32)
            out_TD = out_TD + jnp.einsum("TK,TKD->TD", weights_TK, bias_TKD).astype(out_TD.dtype)
        return out_TD


_GEMM_PARAMS = ("w13", "w2", "w13_bias", "w13_scale", "w2_scale", "w13_scale_inv", "w2_scale_inv")
"""The params `fused_experts` takes, by its argument names."""


def _sharded_experts(x_TD, weights_TK, ids_TK, params: dict[str, nnx.Param], *, activation: str, expert_parallel: bool):
    """`fused_experts` on the trace's mesh: per device on its shard of the weights, then an
    all-reduce; directly without a mesh or with one `model` device."""
    values = {name: param[...] for name, param in params.items()}
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get("model", 1) == 1:
        return fused_experts(x_TD, weights_TK, ids_TK, **values, activation=activation)

    def per_device(x_TD, weights_TK, ids_TK, values):
        first_expert = jax.lax.axis_index("model") * values["w13"].shape[0] if expert_parallel else 0
        out_TD = fused_experts(x_TD, weights_TK, ids_TK, **values, activation=activation, first_expert=first_expert)
        return jax.lax.psum(out_TD, "model")

    replicated = PartitionSpec()
    specs = {name: mesh_spec(mesh, logical_axes_of(param)) for name, param in params.items()}
    sharded = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(replicated, replicated, replicated, specs),
        out_specs=replicated,
        check_vma=False,
    )
    return sharded(x_TD, weights_TK, ids_TK, values)


def fused_experts(
    x_TD: Float[Array, "T D"],
    weights_TK: Float[Array, "T K"],
    ids_TK: Int[Array, "T K"],
    w13: Float[Array, "E D 2 F"],
    w2: Float[Array, "E F D"],
    w13_bias: Float[Array, "E 2 F"] | None = None,
    w13_scale: Float[Array, "E 2 F"] | None = None,
    w2_scale: Float[Array, "E D"] | None = None,
    w13_scale_inv: Float[Array, "E _ 2 F"] | None = None,
    w2_scale_inv: Float[Array, "E _ D"] | None = None,
    *,
    activation: str,
    first_expert: int | Array = 0,
) -> Float[Array, "T D"]:
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) over the experts this call holds,
    `first_expert` .. `first_expert` + E - 1 (the others contribute zero); no down bias.

    With fewer (token, expert) pairs than experts (decode), each pair reads its own expert's
    weights (a gather of M experts, the bytes the step must move anyway); otherwise the pairs
    are sorted by expert and each projection is one `ragged_dot` over all E experts. Weights
    of another dtype than x (FP8) are converted to x's for the GEMM; their scales, one per
    expert and output channel, multiply the GEMM's output rows; block scales (`*_scale_inv`,
    one per input block of the weight and output channel) multiply the weights as the GEMM
    reads them."""
    num_tokens, top_k = ids_TK.shape
    num_experts, hidden, _, width = w13.shape
    dtype = x_TD.dtype
    local_M = ids_TK.reshape(-1) - first_expert
    is_local_M = (local_M >= 0) & (local_M < num_experts)
    if num_tokens * top_k <= num_experts:
        order_M, expert_M, x_MD, project = _gathered_pairs(x_TD, local_M, top_k, num_experts)
    else:
        order_M, expert_M, x_MD, project = _grouped_pairs(x_TD, local_M, is_local_M, top_k, num_experts)
    scale_inv_EGO = None if w13_scale_inv is None else w13_scale_inv.reshape(num_experts, -1, 2 * width)
    gate_up_M2F = project(x_MD, w13.reshape(num_experts, hidden, 2 * width), scale_inv_EGO).reshape(-1, 2, width)
    if w13_scale is not None:
        gate_up_M2F = gate_up_M2F * jnp.take(w13_scale, expert_M, axis=0).astype(dtype)
    if w13_bias is not None:
        gate_up_M2F = gate_up_M2F + jnp.take(w13_bias, expert_M, axis=0)
    h_MF = GATED_ACTIVATIONS[activation](gate_up_M2F[:, 0], gate_up_M2F[:, 1])
    y_MD = project(h_MF.astype(dtype), w2, w2_scale_inv)
    if w2_scale is not None:
        y_MD = y_MD * jnp.take(w2_scale, expert_M, axis=0).astype(dtype)
    if order_M is not None:
        # Back to (token, k) order: the inverse permutation is a gather, not a scatter-add.
        y_MD = jnp.take(y_MD, jnp.argsort(order_M), axis=0)
    y_TKD = y_MD.reshape(num_tokens, top_k, -1)
    weights_TK = jnp.where(is_local_M.reshape(num_tokens, top_k), weights_TK, 0.0).astype(dtype)
    return jnp.einsum("TK,TKD->TD", weights_TK, y_TKD)


def _gathered_pairs(x_TD, local_M, top_k, num_experts):
    """Each (token, expert) pair in (token, k) order, projected by its own expert's weights."""
    expert_M = jnp.clip(local_M, 0, num_experts - 1)
    x_MD = jnp.repeat(x_TD, top_k, axis=0)

    def project(h_MI, w_EIO, scale_inv_EGO=None):
        w_MIO = jnp.take(w_EIO, expert_M, axis=0)
        scale_inv_MGO = None if scale_inv_EGO is None else jnp.take(scale_inv_EGO, expert_M, axis=0)
        return jnp.einsum("MI,MIO->MO", h_MI, _dequantized(w_MIO, scale_inv_MGO, h_MI.dtype))

    return None, expert_M, x_MD, project


def _grouped_pairs(x_TD, local_M, is_local_M, top_k, num_experts):
    """The pairs sorted by expert, each projection one `ragged_dot` over the experts' groups.

    Pairs of other devices' experts sort last, into a group no GEMM covers; their rows borrow
    the last local expert's scales and biases, and their weight is zero."""
    group_M = jnp.where(is_local_M, local_M, num_experts)
    order_M = jnp.argsort(group_M, stable=True)
    group_sizes = jnp.bincount(group_M, length=num_experts + 1)[:num_experts].astype(jnp.int32)
    expert_M = jnp.minimum(jnp.take(group_M, order_M), num_experts - 1)
    x_MD = jnp.take(x_TD, order_M // top_k, axis=0)

    def project(h_MI, w_EIO, scale_inv_EGO=None):
        return jax.lax.ragged_dot(h_MI, _dequantized(w_EIO, scale_inv_EGO, h_MI.dtype), group_sizes)

    return order_M, expert_M, x_MD, project


def _dequantized(w_EIO: Array, scale_inv_EGO: Array | None, dtype) -> Array:
    """Expert weights [E, I, O] in `dtype`; with block scales [E, G, O] (one per I / G input
    rows and output channel), each block times its scale."""
    if scale_inv_EGO is None:
        return w_EIO.astype(dtype)
    num_experts, num_in, num_out = w_EIO.shape
    num_groups = scale_inv_EGO.shape[1]
    w_EGKO = w_EIO.reshape(num_experts, num_groups, num_in // num_groups, num_out).astype(jnp.float32)
    return (w_EGKO * scale_inv_EGO[:, :, None]).reshape(w_EIO.shape).astype(dtype)
