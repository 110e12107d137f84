"""New weights for a running engine's model, with no recompilation (`LLM.update_weights`,
`LLM.get_weights`, `LLM.reload_weights`).

Weights come in vjx's own layout (the nested dict `get_weights` returns: module path ->
array, the LoRA slots left out) or as Hugging Face checkpoint tensors by name. Each array
keeps its param's shape, dtype and sharding, so the compiled steps take the new arrays as
they took the old ones. In vjx's layout an array already on the devices moves device to device
(`jax.device_put` into the param's sharding); checkpoint tensors are laid out by the loader
(fused q/k/v and gate/up, repeated KV heads) on the host first, as at start-up.
"""

import pathlib
from collections.abc import Iterable, Mapping

import jax
import numpy as np
from flax import nnx

from vjx.config import ModelConfig
from vjx.models.loader import fill_from_safetensors, fill_from_tensors, model_params
from vjx.quantization import get_quantization_config


def get_weights(model: nnx.Module) -> dict:
    """The params as a nested dict of arrays (list indices as int keys), vjx's layout."""
    weights: dict = {}
    for path, param in model_params(model).items():
        node = weights
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = param.get_value()
    return weights


def update_weights(model: nnx.Module, model_config: ModelConfig, weights, mesh) -> int:
    """Puts `weights` into the model's params (those not given keep their values): a nested
    dict like `get_weights`'s, or a mapping or iterable of (checkpoint name, tensor). Returns
    how many params changed; raises ValueError naming a tensor that fits no param."""
    if isinstance(weights, nnx.State):
        weights = nnx.to_pure_dict(weights)
    if isinstance(weights, Mapping) and not any(isinstance(key, str) and "." in key for key in weights):
        return _update_from_tree(model, weights)
    tensors = weights.items() if isinstance(weights, Mapping) else weights
    return _update_from_checkpoint(model, model_config, tensors, mesh)


def _update_from_tree(model: nnx.Module, weights: Mapping) -> int:
    params = model_params(model)
    leaves = jax.tree_util.tree_flatten_with_path(weights)[0]
    updates = []
    for key_path, value in leaves:
        path = tuple(getattr(key, "key", getattr(key, "idx", key)) for key in key_path)
        param = params.get(path)
        if param is None:
            raise ValueError(f"weights: {'.'.join(map(str, path))} is no param of the model (see get_weights()).")
        old, name = param.get_value(), ".".join(map(str, path))
        if tuple(value.shape) != old.shape:
            raise ValueError(f"weights: {name} has shape {tuple(value.shape)}, its param {old.shape}.")
        updates.append((param, _placed(value, old)))
    for param, value in updates:
        param.set_value(value)
    return len(updates)


def _placed(value, old: jax.Array) -> jax.Array:
    """`value` in `old`'s dtype and sharding: device to device for a jax array (cast after
    the move, on the devices), cast on the host first for any other array."""
    if not isinstance(value, jax.Array):
        return jax.device_put(np.asarray(value).astype(old.dtype, copy=False), old.sharding)
    value = jax.device_put(value, old.sharding)
    return value if value.dtype == old.dtype else value.astype(old.dtype)


def _check_unquantized(model_config: ModelConfig) -> None:
    if get_quantization_config(model_config.quantization, model_config.hf_config) is not None:
        raise ValueError(
            "weights by checkpoint name need an unquantized model (a quantized one's tensors are "
            "processed at load); pass get_weights()'s layout instead."
        )


def _update_from_checkpoint(
    model: nnx.Module, model_config: ModelConfig, tensors: Iterable[tuple[str, object]], mesh
) -> int:
    _check_unquantized(model_config)
    return fill_from_tensors(model, model_config, ((name, np.asarray(t)) for name, t in tensors), mesh)


def reload_weights(model: nnx.Module, model_config: ModelConfig, path: str, mesh) -> int:
    """Every param from the safetensors files of directory `path` (a checkpoint of the model's
    architecture and shapes)."""
    _check_unquantized(model_config)
    return fill_from_safetensors(model, model_config, pathlib.Path(path), mesh)
