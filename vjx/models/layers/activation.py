"""The MLP activations of the supported families, by their Hugging Face `hidden_act` names."""

import functools
from collections.abc import Callable

import jax

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
}


def check_activation(name: str) -> str:
    """`name` if vjx implements it; otherwise a ValueError listing the ones it does."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act must be one of {sorted(ACTIVATIONS)}, got {name!r}.")
    return name
