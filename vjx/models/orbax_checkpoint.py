"""vjx params as an Orbax checkpoint: `LLM.save_weights(path)` writes one, `load_format="orbax"`
restores it straight into the mesh's shardings (no Hugging Face conversion at start-up).

A saved model directory holds the source model's config, tokenizer and other small files, and
the params under `params/` (Orbax's `StandardCheckpointer`), in vjx's layout: the nested dict
`LLM.get_weights()` returns. A Flax NNX training state of the same params restores too (its
`nnx.State` keeps each array under a `value` key). The params are stored as the saving engine
laid them out: where tensor parallelism repeats KV heads (more devices than KV heads), the
restoring engine must repeat them the same way.
"""

import pathlib
import shutil
from collections.abc import Callable

import jax
from flax import nnx
from jax.sharding import Sharding

PARAMS_DIR = "params"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def save_weights(weights: dict, directory: str, model_dir: str) -> None:
    """Writes `weights` (vjx's layout) under `directory`/params, beside copies of the small
    files of `model_dir` (config, tokenizer, generation config)."""
    import orbax.checkpoint as ocp

    path = pathlib.Path(directory).absolute()
    if (path / PARAMS_DIR).exists():
        raise ValueError(f"save_weights: {path / PARAMS_DIR} exists already; pick a new directory.")
    path.mkdir(parents=True, exist_ok=True)
    for source in pathlib.Path(model_dir).iterdir():
        is_weights = source.suffix in _WEIGHT_SUFFIXES or source.name.endswith(".index.json")
        if source.is_file() and not is_weights and not (path / source.name).exists():
            shutil.copy2(source, path / source.name)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / PARAMS_DIR, weights)
    checkpointer.wait_until_finished()


def restore_weights(
    params: dict[tuple, nnx.Param], directory: str, sharding_of: Callable[[tuple, nnx.Param], Sharding]
) -> None:
    """Fills `params` (by module path) from the checkpoint in `directory`, each array read
    straight into `sharding_of(path, param)` in the param's dtype."""
    import orbax.checkpoint as ocp

    path = pathlib.Path(directory).absolute() / PARAMS_DIR
    if not path.is_dir():
        raise ValueError(f"load_format='orbax' needs an Orbax checkpoint in {path} (LLM.save_weights writes one).")
    checkpointer = ocp.StandardCheckpointer()
    saved = checkpointer.metadata(path).item_metadata.tree
    matched: dict[tuple, nnx.Param] = {}

    def target(key_path, leaf):
        param_path = _param_path(key_path)
        param = params.get(param_path)
        if param is None:
            raise ValueError(f"the checkpoint's {'.'.join(map(str, param_path))} is no param of the model.")
        if tuple(leaf.shape) != tuple(param.shape):
            raise ValueError(
                f"the checkpoint's {'.'.join(map(str, param_path))} has shape {tuple(leaf.shape)}, the param "
                f"{tuple(param.shape)} (KV heads repeated differently by tensor parallelism?)."
            )
        matched[param_path] = param
        return jax.ShapeDtypeStruct(param.shape, param.dtype, sharding=sharding_of(param_path, param))

    is_leaf = lambda x: hasattr(x, "shape")  # noqa: E731 - the saved arrays' metadata
    targets = jax.tree_util.tree_map_with_path(target, saved, is_leaf=is_leaf)
    missing = sorted(".".join(map(str, p)) for p in set(params) - set(matched))
    if missing:
        raise ValueError(f"the checkpoint in {path} lacks params {missing[:5]}.")
    restored = checkpointer.restore(path, targets)
    for key_path, value in jax.tree_util.tree_flatten_with_path(restored)[0]:
        matched[_param_path(key_path)].set_value(value)


def _param_path(key_path) -> tuple:
    """A saved leaf's module path: list indices back to ints, an nnx.State's `value` dropped."""
    keys = [getattr(key, "key", getattr(key, "idx", key)) for key in key_path]
    if keys and keys[-1] == "value":
        keys = keys[:-1]
    return tuple(int(key) if isinstance(key, str) and key.isdigit() else key for key in keys)
