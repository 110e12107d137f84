"""Builds a model abstractly and fills its params from safetensors files or random values.

The module is created with `nnx.eval_shape`, so no weight is initialized twice and no full
copy of the model is built on the host: each checkpoint tensor is memory-mapped, renamed and
laid out as its param, and each device then receives only its own block of it, cast to the
param dtype (the `NamedSharding` comes from the param's logical axes through
vjx/sharding/rules.py; without a mesh, the one default device takes it whole). When the mesh
has more `model` devices than the model has KV heads, K/V projections are repeated per head
at this point (vjx/sharding/placement.py), so their params hold the repeated heads.

A checkpoint tensor's name is the param's module path plus the layer's HF name for it:
`model.layers.0.self_attn.o_proj.weight` fills `model.layers[0].self_attn.o_proj.kernel`. A
fused layer takes several tensors, named after its `HF_PARTS` beside it:
`model.layers.0.self_attn.{q,k,v}_proj.weight` fill `model.layers[0].self_attn.qkv_proj.kernel`,
which is placed once all of its parts are read. A layer's `OPTIONAL_HF_NAMES` (an attention
layer's fp8 KV cache scales) may be absent: their params then keep None, the layer's default.
"""

import dataclasses
import functools
import json
import pathlib
import struct
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, Sharding, SingleDeviceSharding

from vjx.attention.backend import AttentionBackend
from vjx.config import ModelConfig
from vjx.models.layers.fused_moe import FusedMoE
from vjx.models.layers.linear import INIT_STDDEV, Linear
from vjx.models.layers.param import HFParamLayer, logical_axes_of
from vjx.models.orbax_checkpoint import restore_weights
from vjx.models.registry import get_model_class
from vjx.quantization import QuantizationConfig, get_quantization_config
from vjx.sharding.mesh import model_axis_size
from vjx.sharding.pipeline import param_stages, stage_layer_ranges
from vjx.sharding.placement import kv_head_replicas, place, repeat_kv_heads
from vjx.sharding.rules import logical_sharding

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
LOAD_FORMATS = ("auto", "safetensors", "dummy", "orbax")

_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": jnp.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "F8_E4M3": jnp.float8_e4m3fn,
    "BOOL": np.bool_,
}
# Checkpoint tensors that are derived from the config, not weights of the model.
_DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class _ParamSlot:
    """Where one checkpoint tensor goes: the layer that lays it out, the param it fills,
    which of the layer's `num_parts` parts it is, and whether a checkpoint may lack it."""

    layer: nnx.Module
    attr: str
    param: nnx.Param
    part: int
    num_parts: int
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where a param's value lives: its sharding and how often its KV heads repeat. With
    pipeline stages, on the mesh of the first stage that holds it (vjx/sharding/pipeline.py)."""

    mesh: Mesh | None
    stage_meshes: tuple[Mesh, ...] = ()
    layer_ranges: tuple[range, ...] = ()

    def sharding(self, param: nnx.Param, name: str = "") -> Sharding:
        if len(self.stage_meshes) > 1:
            stage = param_stages(name, list(self.layer_ranges), is_tied=False)[0]
            return logical_sharding(self.stage_meshes[stage], logical_axes_of(param))
        return self.sharding_of(logical_axes_of(param))

    def sharding_of(self, logical_axes: tuple[str | None, ...]) -> Sharding:
        if self.mesh is None:
            return SingleDeviceSharding(jax.devices()[0])
        return logical_sharding(self.mesh, logical_axes)

    def kv_head_replicas(self, param: nnx.Param) -> int:
        """Copies of each KV head of `param` (1 for params without KV heads)."""
        axes = logical_axes_of(param)
        if "kv_heads" not in axes:
            return 1
        return kv_head_replicas(param.shape[axes.index("kv_heads")], model_axis_size(self.mesh))


class _ShapeOnlyRngs(nnx.Rngs):
    """The `rngs` of a model built under `nnx.eval_shape`, whose init values are never read
    (the loader fills every param). nnx's own stream would count its draws in a traced
    variable, and every count update asks the tracer for its sharding, which JAX answers by
    searching the whole trace for the tracer's origin: quadratic in the model's depth."""

    def params(self) -> jax.Array:
        return jax.random.key(0)


def get_model(
    model_config: ModelConfig,
    backend: AttentionBackend,
    *,
    mesh: Mesh | None = None,
    enable_expert_parallel: bool = False,
    stage_meshes: Sequence[Mesh] = (),
    is_draft_head: bool = False,
) -> nnx.Module:
    """The model of `model_config` with its weights on the device (or spread over `mesh`,
    whole experts per device with `enable_expert_parallel`); with several `stage_meshes`,
    each layer's params on its pipeline stage's mesh. `is_draft_head`: a speculative draft
    head's checkpoint (vjx/models/registry.py)."""
    if model_config.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {model_config.dtype!r}.")
    if model_config.load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {model_config.load_format!r}.")
    model_cls = get_model_class(model_config.hf_config, is_draft_head)
    dtype = jnp.dtype(DTYPES[model_config.dtype])
    model = nnx.eval_shape(
        lambda: model_cls(
            model_config.hf_config,
            dtype=dtype,
            backend=backend,
            rngs=_ShapeOnlyRngs(model_config.seed),
            max_model_len=model_config.max_model_len,
            enable_expert_parallel=enable_expert_parallel,
        )
    )
    quant_config = get_quantization_config(model_config.quantization, model_config.hf_config)
    quantized = _set_quant_methods(model, quant_config) if quant_config is not None else []
    slots = _param_slots(model)
    placement = _Placement(mesh, tuple(stage_meshes), tuple(_stage_layer_ranges(model, len(stage_meshes))))
    if model_config.load_format == "orbax":
        if quantized:
            raise ValueError("load_format='orbax' with a quantized model is not built yet.")
        sharding_of = lambda path, param: placement.sharding(param, ".".join(map(str, path)))  # noqa: E731
        restore_weights(model_params(model), model_config.model, sharding_of)
    elif model_config.load_format == "dummy":
        _fill_dummy(slots, model_config.seed, placement)
    else:
        names = _checkpoint_names(model_config, is_draft_head)
        _fill_from_safetensors(slots, pathlib.Path(model_config.model), names, placement)
    for layer in quantized:
        layer.quant_method.process_weights_after_loading(layer, placement.sharding_of)
    return model


def model_params(model: nnx.Module) -> dict[tuple, nnx.Param]:
    """Every param that holds an array (or its shape, before loading), by module path; the
    LoRA slots (vjx/lora/layers.py: the engine's, not weights) left out."""
    return {
        path: node
        for path, node in nnx.iter_graph(model)
        if isinstance(node, nnx.Param) and node.get_value() is not None and "lora" not in path
    }


def fill_from_tensors(
    model: nnx.Module, model_config: ModelConfig, tensors: Iterator[tuple[str, np.ndarray]], mesh: Mesh | None
) -> int:
    """Puts checkpoint tensors (by their names in `model_config`'s checkpoint) into a loaded
    model's params, laid out and placed as at load; params not named keep their values.
    Returns how many params changed; a fused param needs all of its parts."""
    return _fill(_param_slots(model), tensors, _checkpoint_names(model_config), _Placement(mesh), require_all=False)


def fill_from_safetensors(model: nnx.Module, model_config: ModelConfig, directory: pathlib.Path, mesh) -> int:
    """Every param of a loaded model again from the safetensors files in `directory`."""
    slots, names = _param_slots(model), _checkpoint_names(model_config)
    return _fill_from_safetensors(slots, directory, names, _Placement(mesh))


def _checkpoint_names(model_config: ModelConfig, is_draft_head: bool = False) -> "_CheckpointNames":
    model_cls = get_model_class(model_config.hf_config, is_draft_head)
    is_tied = getattr(model_config.hf_text_config, "tie_word_embeddings", False)
    return _CheckpointNames(model_cls.CHECKPOINT_PREFIXES, model_cls.CHECKPOINT_SUBSTRINGS, is_tied)


def _stage_layer_ranges(model: nnx.Module, num_stages: int) -> list[range]:
    if num_stages <= 1:
        return []
    return stage_layer_ranges(len(model.model.layers), num_stages)


def _set_quant_methods(model: nnx.Module, quant_config: QuantizationConfig) -> list[Linear | FusedMoE]:
    """Hands each linear layer and MoE layer the method `quant_config` picks for its module
    path, which declares the params the layer loads; returns the layers it quantizes."""
    quantized = []
    for path, layer in nnx.iter_graph(model):
        if isinstance(layer, (Linear, FusedMoE)):
            get_method = quant_config.get_moe_method if isinstance(layer, FusedMoE) else quant_config.get_quant_method
            method = get_method(layer, ".".join(map(str, path)))
            if method is not None:
                layer.quant_method = method
                method.create_weights(layer)
                quantized.append(layer)
    return quantized


def _param_slots(model: nnx.Module) -> dict[str, _ParamSlot]:
    """Every param of `model`, keyed by the names its checkpoint tensors have (one per part)."""
    slots = {}
    for path, node in nnx.iter_graph(model):
        if not isinstance(node, HFParamLayer):
            continue
        for name, tensor in node.hf_tensors([str(part) for part in path]).items():
            param = getattr(node, tensor.attr)
            slots[name] = _ParamSlot(node, tensor.attr, param, tensor.part, tensor.num_parts, tensor.optional)
    return slots


def _fill_dummy(slots: dict[str, _ParamSlot], seed: int, placement: _Placement) -> None:
    """Random normal params (norm weights: ones), drawn on the devices in the param dtype.

    Each device draws only its own block (JAX's partitionable threefry), and the values do not
    depend on the mesh, so every layout holds the same model. A fused param is drawn once,
    under the name of its first part; optional params keep their default."""
    for index, name in enumerate(sorted(slots)):
        slot = slots[name]
        if slot.part or slot.optional:
            continue
        param = slot.param
        make = _dummy_fn(
            param.shape,
            param.dtype,
            placement.sharding(param, name),
            logical_axes_of(param),
            placement.kv_head_replicas(param),
        )
        param.set_value(make(jnp.uint32(seed), jnp.uint32(index)))


@functools.cache
def _dummy_fn(
    shape: tuple[int, ...], dtype: jnp.dtype, sharding: Sharding, logical_axes: tuple[str | None, ...], replicas: int
):
    """One compiled generator per (shape, dtype, sharding, axes, KV head repeats), shared by
    all layers."""

    def make(seed, index):
        if logical_axes == ("norm",):
            return jnp.ones(shape, dtype)
        key = jax.random.fold_in(jax.random.key(seed), index)
        if jnp.issubdtype(dtype, jnp.integer):
            info = jnp.iinfo(dtype)
            return jax.random.randint(key, shape, info.min, info.max, jnp.int32).astype(dtype)
        draw_dtype = dtype if dtype.itemsize > 1 else jnp.float32
        value = (jax.random.normal(key, shape, draw_dtype) * jnp.asarray(INIT_STDDEV, draw_dtype)).astype(dtype)
        return repeat_kv_heads(value, logical_axes, replicas)

    return jax.jit(make, out_shardings=sharding)


@dataclasses.dataclass(frozen=True)
class _CheckpointNames:
    """How checkpoint tensor names become param slot names."""

    prefixes: dict[str, str | None]
    """Checkpoint name prefix -> the model's (None: tensors the model does not use, e.g. a
    vision tower); the first matching prefix applies."""
    substrings: dict[str, str]
    """Name parts renamed wherever they occur, after the prefix."""
    is_tied: bool
    """The LM head is the embedding, so a stored `lm_head.weight` is a copy to skip."""

    def slot_name(self, name: str) -> str | None:
        """The slot `name` fills, or None for a tensor to skip."""
        for prefix, new_prefix in self.prefixes.items():
            if name.startswith(prefix):
                if new_prefix is None:
                    return None
                name = new_prefix + name[len(prefix) :]
                break
        for old, new in self.substrings.items():
            name = name.replace(old, new)
        if name.endswith(_DERIVED_SUFFIXES) or (self.is_tied and name == "lm_head.weight"):
            return None
        return name


def _fill_from_safetensors(
    slots: dict[str, _ParamSlot], directory: pathlib.Path, names: _CheckpointNames, placement: _Placement
) -> int:
    tensors = (item for path in _safetensors_files(directory) for item in _read_safetensors(path))
    try:
        return _fill(slots, tensors, names, placement, require_all=True)
    except ValueError as e:
        raise ValueError(f"the checkpoint in {directory}: {e}") from None


def _fill(
    slots: dict[str, _ParamSlot],
    tensors: Iterator[tuple[str, np.ndarray]],
    names: _CheckpointNames,
    placement: _Placement,
    require_all: bool,
) -> int:
    """Fills the slots `tensors` name; returns how many params were placed. Every slot must
    be filled with `require_all`, and every fused param's parts in any case; the params change
    only once all tensors fit (a refused update changes none)."""
    loaded = set()
    pending: dict[int, dict[int, tuple[str, np.ndarray]]] = {}
    placed: list[tuple[nnx.Param, jax.Array]] = []
    for checkpoint_name, tensor in tensors:
        name = names.slot_name(checkpoint_name)
        if name is None:
            continue
        if name not in slots:
            raise ValueError(
                f"tensor {checkpoint_name!r} matches no param of the model; expected names like {sorted(slots)[:3]}."
            )
        slot = slots[name]
        loaded.add(name)
        parts = pending.setdefault(id(slot.param), {})
        parts[slot.part] = (name, tensor)
        if len(parts) == slot.num_parts:
            del pending[id(slot.param)]
            placed.append((slot.param, _fill_param(slot, [parts[part] for part in range(slot.num_parts)], placement)))
    missing = sorted(
        name
        for name in set(slots) - loaded
        if not slots[name].optional and (require_all or id(slots[name].param) in pending)
    )
    if missing:
        raise ValueError(f"tensors {missing} are missing.")
    for param, value in placed:
        param.set_value(value)
    return len(placed)


def _fill_param(slot: _ParamSlot, parts: list[tuple[str, np.ndarray]], placement: _Placement) -> jax.Array:
    """The (name, tensor) parts of one param laid out, its KV heads repeated, placed. A param
    that holds None (an optional one) takes the shape and dtype of its tensor's layout."""
    param = slot.param
    unset = param.get_value() is None
    shapes = {name: tensor.shape for name, tensor in parts}
    try:
        value = slot.layer.to_param_layout(slot.attr, [tensor for _, tensor in parts])
    except ValueError as error:
        if unset:
            raise ValueError(f"tensors with shapes {shapes} do not fit {slot.attr}: {error}") from None
        value = None
    if unset:
        return place(value, value.dtype, placement.sharding(param, parts[0][0]))
    if value is None or value.shape != param.shape:
        raise ValueError(f"tensors with shapes {shapes} do not fit the param's shape {param.shape}.")
    value = repeat_kv_heads(value, logical_axes_of(param), placement.kv_head_replicas(param))
    return place(value, param.dtype, placement.sharding(param, parts[0][0]))


def _safetensors_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The shards listed by `model.safetensors.index.json`, else every `*.safetensors` file."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model directory {directory} holds no *.safetensors file.")
    return files


def _read_safetensors(path: pathlib.Path) -> Iterator[tuple[str, np.ndarray]]:
    """Memory-mapped tensors of one file (numpy cannot read bfloat16 through `safetensors`).

    The format: an 8-byte little-endian header size, a JSON header giving each tensor's dtype,
    shape and byte range, then the raw bytes.
    """
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
    header.pop("__metadata__", None)
    if not header:
        return
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_size)
    for name, info in header.items():
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r} in {path} has unsupported dtype {info['dtype']}.")
        start, end = info["data_offsets"]
        dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
        yield name, data[start:end].view(dtype).reshape(info["shape"])
