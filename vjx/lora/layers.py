"""Multi-LoRA on the device: adapters stacked in `max_loras` slots beside each target
projection, and one per-token slot id that picks each token's adapter.

Legend: T tokens, L adapter slots (`max_loras`), R the rank axis (the layer's fused parts x
`max_lora_rank`), then the projection's own input and output dimensions (D hidden, K kv heads,
C = G + 2 q/k/v heads per kv head, H head dim, N query heads, P gate/up parts, F MLP width).
In einsum strings L and R are `l` and `r`: lowercase never clashes with a layer's dimensions.

A `Linear` with a `LoRAWeights` companion (`linear.lora`) returns
y = base(x) + einsum(mask(einsum(x, lora_a)), lora_b): every token runs through every slot's
A (a [T, L, R] product, small next to the base GEMM), the tokens' one-hot slot masks zero all
but their own slot (a slot id of -1, the base model, zeroes them all), and the contraction
with B over (L, R) sums the one survivor. Every shape is fixed by `max_loras` and
`max_lora_rank`, so loading or swapping an adapter writes values into a slot and never
recompiles the step.

Layout of one slot of a layer that fuses P checkpoint modules: the rank axis holds P blocks of
`max_lora_rank`, block p belonging to module p (q, k, v or gate, up). lora_a[slot, ..., block p]
is module p's A^T (zero past its rank r); lora_b[slot, block p] is module p's
scaling * B^T laid into the fused output dimensions where the kernel keeps module p's outputs
(the q columns of each kv-head group, ...) and zero elsewhere: block-diagonal, so q's rank
never reaches k's outputs. A module the adapter does not target leaves its block zero.

How a runner drives it:
- `add_lora(model, max_loras=..., max_lora_rank=..., dtype=...)` once after loading, before
  the step is compiled.
- In the jitted step, after `model = nnx.merge(graphdef, state)` and before the forward:
  `model.lora_context.token_slots.set_value(token_slots_T)` ([T] int32, the padded batch's
  slot per token, -1 for base-model and padding tokens).
- `write_adapter(model, slot, adapter)` / `clear_slot(model, slot)` between steps; they replace
  the LoRA params' arrays (same shape, dtype and sharding), so a runner that keeps the
  model's state split or flattened re-reads it (`nnx.state(model)`) afterwards.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, Sharding
from jaxtyping import Array, Float

from vjx.lora.peft_loader import LoRAAdapter, LoRAModuleWeights
from vjx.models.layers.linear import Linear, MergedLinear, QKVLinear
from vjx.models.layers.param import logical_axes_of, logical_param
from vjx.quantization.base import flat_shapes, out_axes
from vjx.sharding.placement import repeat_kv_heads
from vjx.sharding.rules import logical_sharding

LORA_SITES = (
    ("self_attn", "qkv_proj", QKVLinear, ("q_proj", "k_proj", "v_proj")),
    ("self_attn", "o_proj", Linear, ("o_proj",)),
    ("mlp", "gate_up_proj", MergedLinear, ("gate_proj", "up_proj")),
    ("mlp", "down_proj", Linear, ("down_proj",)),
)
"""Where each decoder layer gets LoRA: (block, projection attribute, its class, the PEFT
modules it fuses, in the kernel's part order)."""


class TokenSlots(nnx.Variable):
    """A step input kept on the model: each token's adapter slot. Not a param, so
    `nnx.split(model, nnx.Param, ...)` leaves it out of the weights."""


class LoRAContext(nnx.Module):
    """What every LoRA layer of a model reads per step, shared by reference
    (`model.lora_context`, and `.context` of each `LoRAWeights`)."""

    def __init__(self):
        # [T] int32 slot per token; -1: the base model. Empty until the step sets it, so a
        # forward that forgets to fails at trace time instead of running on stale slots.
        self.token_slots = TokenSlots(jnp.full((0,), -1, jnp.int32))


class LoRAWeights(nnx.Module):
    """The `max_loras` adapter slots of one `Linear`: lora_a [L, *in, R], lora_b [L, R, *out]
    (scaling folded into lora_b), sharded like the kernel's input and output dimensions."""

    def __init__(
        self, linear: Linear, context: LoRAContext, module_names: tuple[str, ...], *, max_loras, max_lora_rank, dtype
    ):
        self.context = context
        self.module_names = module_names
        self.max_lora_rank = max_lora_rank
        in_shape, out_shape = flat_shapes(linear)
        kernel_axes = logical_axes_of(linear.kernel)
        # A quantized kernel that packs its input dims has no per-dim names: replicate them.
        has_in_axes = len(kernel_axes) == len(in_shape) + len(out_shape)
        in_axes = kernel_axes[: len(in_shape)] if has_in_axes else (None,) * len(in_shape)
        rank = len(module_names) * max_lora_rank
        self.lora_a = _zeros((max_loras, *in_shape, rank), dtype, (None, *in_axes, None), linear.kernel)
        self.lora_b = _zeros((max_loras, rank, *out_shape), dtype, (None, None, *out_axes(linear)), linear.kernel)
        self.kv_head_replicas = out_shape[0] // linear.out_shape[0] if isinstance(linear, QKVLinear) else 1
        self.shrink_einsum, self.expand_einsum = _lora_einsums(linear.einsum_str)

    def __call__(self, x: Float[Array, "T ..."]) -> Float[Array, "T ..."]:
        """The adapters' delta for the tokens `x` (the base layer's input)."""
        token_slots_T = self.context.token_slots.get_value()
        if token_slots_T.shape != x.shape[:1]:
            raise ValueError(
                f"token_slots has shape {token_slots_T.shape} but the step has {x.shape[0]} tokens: set "
                "model.lora_context.token_slots to the step's [T] slots after nnx.merge, before the forward."
            )
        lora_a, lora_b = self.lora_a[...], self.lora_b[...]
        xa_TLR = jnp.einsum(self.shrink_einsum, x.astype(lora_a.dtype), lora_a, preferred_element_type=jnp.float32)
        is_slot_TL = token_slots_T[:, None] == jnp.arange(lora_a.shape[0], dtype=token_slots_T.dtype)
        xa_TLR = jnp.where(is_slot_TL[:, :, None], xa_TLR, 0.0).astype(lora_b.dtype)
        return jnp.einsum(self.expand_einsum, xa_TLR, lora_b)

    @property
    def max_loras(self) -> int:
        return self.lora_a.shape[0]

    def write(self, slot: int, lora_a: np.ndarray, lora_b: np.ndarray) -> None:
        """Sets slot `slot` to `lora_a` [*in, R] and `lora_b` [R, *out] (one compiled update
        per param shape and sharding, whatever the slot)."""
        for param, value in ((self.lora_a, lora_a), (self.lora_b, lora_b)):
            current = param.get_value()
            param.set_value(_slot_writer(current.sharding)(current, jnp.int32(slot), value))


def _zeros(shape: tuple[int, ...], dtype, logical_axes: tuple[str | None, ...], kernel: nnx.Param) -> nnx.Param:
    """A zero param placed like `kernel` is: on the mesh it lives on, split by `logical_axes`."""
    kernel_sharding = kernel.get_value().sharding
    if isinstance(kernel_sharding, NamedSharding):
        sharding = logical_sharding(kernel_sharding.mesh, logical_axes)
    else:
        sharding = kernel_sharding
    return logical_param(jnp.zeros(shape, dtype, device=sharding), logical_axes)


@functools.cache
def _slot_writer(sharding: Sharding):
    def write(buffer_LX, slot, value_X):
        return buffer_LX.at[slot].set(value_X.astype(buffer_LX.dtype))

    return jax.jit(write, out_shardings=sharding)


def _lora_einsums(einsum_str: str) -> tuple[str, str]:
    """The shrink (x, lora_a -> xa) and expand (xa, lora_b -> y) einsums of a layer whose base
    einsum is `einsum_str` (e.g. "TD,DKCH->TKCH": "TD,lDr->Tlr" and "Tlr,lrKCH->TKCH")."""
    inputs, output = einsum_str.replace(" ", "").split("->")
    x_dims, kernel_dims = inputs.split(",")
    batch = "".join(d for d in x_dims if d not in kernel_dims)
    if len(batch) != 1 or "l" in einsum_str or "r" in einsum_str:
        raise ValueError(f"LoRA needs a projection of [T, ...] tokens, got einsum_str {einsum_str!r}.")
    in_dims = "".join(d for d in kernel_dims if d in x_dims)
    out_dims = kernel_dims[len(in_dims) :]
    return f"{x_dims},l{in_dims}r->{batch}lr", f"{batch}lr,lr{out_dims}->{output}"


def add_lora(model: nnx.Module, *, max_loras: int, max_lora_rank: int, dtype) -> None:
    """Gives every decoder layer's q/k/v, o, gate/up and down projections `max_loras` empty
    adapter slots of rank up to `max_lora_rank` (params in `dtype`), and the model one shared
    `LoRAContext` at `model.lora_context`. Raises ValueError for a model whose layers are not
    dense attention + gated MLP blocks (MoE, MLA, state-space layers)."""
    for name, value in (("max_loras", max_loras), ("max_lora_rank", max_lora_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    if getattr(model, "lora_context", None) is not None:
        raise ValueError("the model already has LoRA slots (model.lora_context is set).")
    sites = [(linear, names) for _, linear, names in _model_sites(model, lambda linear: linear.lora is None)]
    context = LoRAContext()
    for linear, module_names in sites:
        linear.lora = LoRAWeights(
            linear, context, module_names, max_loras=max_loras, max_lora_rank=max_lora_rank, dtype=jnp.dtype(dtype)
        )
    model.lora_context = context


def write_adapter(model: nnx.Module, slot: int, adapter: LoRAAdapter) -> None:
    """Writes `adapter` into slot `slot` of every LoRA layer of `model` (after `add_lora`).
    Tokens whose slot id is `slot` then run with it. Everything is checked before anything
    is written, so a refused adapter leaves the slot as it was."""
    sites = _lora_sites(model)
    _check_slot(slot, sites)
    _check_adapter(adapter, sites)
    values = [
        (linear.lora, *_pack(linear, [adapter.weights.get((layer, name)) for name in names], adapter.scaling))
        for layer, linear, names in sites
    ]
    for lora, lora_a, lora_b in values:
        lora.write(slot, lora_a, lora_b)


def clear_slot(model: nnx.Module, slot: int) -> None:
    """Zeroes slot `slot` of every LoRA layer: its tokens then run the base model."""
    sites = _lora_sites(model)
    _check_slot(slot, sites)
    for _, linear, names in sites:
        linear.lora.write(slot, *_pack(linear, [None] * len(names), 0.0))


def _model_sites(model: nnx.Module, is_ready) -> list[tuple[int, Linear, tuple[str, ...]]]:
    """(layer index, projection, PEFT modules it fuses) of every LoRA site of `model`, each
    checked to exist with its expected class, parts and `is_ready(linear)`."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"LoRA needs a decoder model with layers at model.model.layers, got {type(model).__name__}.")
    sites = []
    for layer_idx, layer in enumerate(layers):
        for block_name, attr, cls, module_names in LORA_SITES:
            linear = getattr(getattr(layer, block_name, None), attr, None)
            if not isinstance(linear, cls) or len(_unfused(linear).part_widths(linear)) != len(module_names):
                raise ValueError(
                    f"{type(model).__name__}: layer {layer_idx} has no {cls.__name__} {block_name}.{attr} fusing "
                    f"{list(module_names)}; vjx builds LoRA for dense attention + gated-MLP families "
                    "(Llama, Mistral, Qwen, Gemma, Phi-3, ...), not MoE, MLA or state-space layers."
                )
            if not is_ready(linear):
                raise ValueError(f"layer {layer_idx} {block_name}.{attr} is not in the expected LoRA state.")
            sites.append((layer_idx, linear, module_names))
    return sites


def _lora_sites(model: nnx.Module) -> list[tuple[int, Linear, tuple[str, ...]]]:
    if getattr(model, "lora_context", None) is None:
        raise ValueError("the model has no LoRA slots: call add_lora(model, ...) first.")
    return _model_sites(model, lambda linear: linear.lora is not None)


def _check_slot(slot: int, sites: list) -> None:
    max_loras = sites[0][1].lora.max_loras
    if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= slot < max_loras:
        raise ValueError(f"slot must be an integer in [0, {max_loras}) (max_loras), got {slot!r}.")


def _check_adapter(adapter: LoRAAdapter, sites: list) -> None:
    """The adapter's layers, modules, rank and factor shapes fit the model's LoRA layers."""
    max_lora_rank = sites[0][1].lora.max_lora_rank
    if not 1 <= adapter.rank <= max_lora_rank:
        raise ValueError(f"the adapter's rank must be in [1, {max_lora_rank}] (max_lora_rank), got {adapter.rank}.")
    expected = {}
    for layer, linear, names in sites:
        in_width = int(np.prod(linear.in_shape))
        for name, out_width in zip(names, _unfused(linear).part_widths(linear), strict=True):
            expected[layer, name] = (in_width, out_width)
    num_layers = 1 + max(layer for layer, _, _ in sites)
    for (layer, name), weights in adapter.weights.items():
        if (layer, name) not in expected:
            raise ValueError(
                f"the adapter has weights for layer {layer} {name}; the model has {num_layers} layers "
                f"with LoRA on {sorted({n for _, n in expected})}."
            )
        in_width, out_width = expected[layer, name]
        shapes = (weights.lora_a.shape, weights.lora_b.shape)
        if shapes != ((adapter.rank, in_width), (out_width, adapter.rank)):
            raise ValueError(
                f"the adapter's layer {layer} {name} has lora_A {shapes[0]} and lora_B {shapes[1]}; the model "
                f"needs ({adapter.rank}, {in_width}) and ({out_width}, {adapter.rank})."
            )


def _unfused(linear: Linear) -> type[Linear]:
    """The class whose `part_widths` and `join_outputs` describe `linear`'s parts one checkpoint
    module each (a Fused* layer keeps its unfused parent's output layout)."""
    for cls in (QKVLinear, MergedLinear):
        if isinstance(linear, cls):
            return cls
    return Linear


def _pack(linear: Linear, parts: list[LoRAModuleWeights | None], scaling: float) -> tuple[np.ndarray, np.ndarray]:
    """One slot's lora_a [*in, R] and lora_b [R, *out] of `linear` from its parts' factors (None:
    a module the adapter leaves alone), in the block-diagonal layout of the module docstring."""
    lora = linear.lora
    cls, rank = _unfused(linear), lora.max_lora_rank
    widths = cls.part_widths(linear)
    in_width = int(np.prod(linear.in_shape))
    a_blocks, b_blocks = [], []
    for part, weights in enumerate(parts):
        a_block = np.zeros((in_width, rank), np.float32)
        rows = [np.zeros((rank, width), np.float32) for width in widths]
        if weights is not None:
            part_rank = weights.lora_a.shape[0]
            a_block[:, :part_rank] = weights.lora_a.T
            rows[part][:part_rank] = weights.lora_b.T * np.float32(scaling)
        a_blocks.append(a_block)
        b_blocks.append(cls.join_outputs(linear, rows))
    lora_a = np.concatenate(a_blocks, axis=1).reshape(*linear.in_shape, -1)
    lora_b = np.concatenate(b_blocks, axis=0)
    lora_b = repeat_kv_heads(lora_b, logical_axes_of(lora.lora_b)[1:], lora.kv_head_replicas)
    return lora_a, lora_b
