"""The MLP activations of the supported families, by their Hugging Face `hidden_act` names,
and the gated forms the MoE experts apply to their gate and up halves (vLLM's names)."""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
}

SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


def swiglu_oai(gate: jax.Array, up: jax.Array) -> jax.Array:
    """gpt-oss's clamped SwiGLU: gate clamped above, up on both sides, at the limit, then
    gate * sigmoid(alpha * gate) * (up + 1)."""
    gate = jnp.minimum(gate, SWIGLU_OAI_LIMIT)
    up = jnp.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return gate * jax.nn.sigmoid(gate * SWIGLU_OAI_ALPHA) * (up + 1)


def _gated(act: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array, jax.Array], jax.Array]:
    return lambda gate, up: act(gate) * up


GATED_ACTIVATIONS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    **{name: _gated(act) for name, act in ACTIVATIONS.items()},
    "swigluoai": swiglu_oai,
}
"""(gate, up) -> the experts' hidden activations."""


def check_activation(name: str) -> str:
    """`name` if vjx implements it; otherwise a ValueError listing the ones it does."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act must be one of {sorted(ACTIVATIONS)}, got {name!r}.")
    return name


def check_gated_activation(name: str) -> str:
    """`name` if the MoE experts implement it; otherwise a ValueError listing the ones they do."""
    if name not in GATED_ACTIVATIONS:
        raise ValueError(f"the experts' activation must be one of {sorted(GATED_ACTIVATIONS)}, got {name!r}.")
    return name
