"""Params that name their dimensions with logical axes, and the hook that loads HF tensors.

Every param of a vjx model carries the logical axis names of its dimensions as the
`out_sharding` metadata of an `nnx.Param`; vjx/sharding/rules.py maps them to mesh axes.
Flax's eager sharding stays off for them: the names are logical, not mesh axes, and the
loader places each param itself through the rules table.
"""

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import jax
import numpy as np
from flax import nnx


def logical_param(value: jax.Array | jax.ShapeDtypeStruct, logical_axes: tuple[str | None, ...]) -> nnx.Param:
    """An `nnx.Param` holding `value`, one logical axis name per dimension."""
    if len(logical_axes) != len(value.shape):
        raise ValueError(
            f"logical_axes must name each of the {len(value.shape)} dimensions of shape "
            f"{tuple(value.shape)}, got {logical_axes}."
        )
    return nnx.Param(value, out_sharding=logical_axes, eager_sharding=False)


def logical_axes_of(param: nnx.Variable) -> tuple[str | None, ...]:
    """The logical axis names `logical_param` gave `param`."""
    return tuple(param.get_metadata()["out_sharding"])


class HFParamLayer:
    """A layer whose params come from Hugging Face tensors of the same module path.

    `HF_NAMES` maps the HF tensor's last name part to the param attribute. A layer that fuses
    several checkpoint modules names them in `HF_PARTS` (siblings of its own path: a
    `qkv_proj` is filled from `q_proj`, `k_proj` and `v_proj`); otherwise its own path is the
    one part. `to_param_layout` turns the part tensors, in `HF_PARTS` order, into the param's
    layout (the default keeps the one tensor, up to a reshape).

    `OPTIONAL_HF_NAMES` are tensors a checkpoint may lack (an attention layer's fp8 KV cache
    scales): their params hold None until a checkpoint gives them, and the tensor's layout
    then fixes the param's shape and dtype.

    A layer whose params each gather different tensors (the experts of a MoE layer) overrides
    `hf_tensors` instead.
    """

    HF_NAMES: ClassVar[dict[str, str]] = {}
    HF_PARTS: tuple[str, ...] = ()
    OPTIONAL_HF_NAMES: ClassVar[frozenset[str]] = frozenset()

    def hf_tensors(self, path: Sequence[str]) -> dict[str, "HFTensor"]:
        """The checkpoint tensors of the layer at module path `path`, by full name."""
        prefixes = [".".join([*path[:-1], part]) for part in self.HF_PARTS] or [".".join(path)]
        tensors = {}
        for hf_leaf, attr in self.HF_NAMES.items():
            if getattr(self, attr) is None:
                continue
            optional = hf_leaf in self.OPTIONAL_HF_NAMES
            for part, prefix in enumerate(prefixes):
                tensors[f"{prefix}.{hf_leaf}"] = HFTensor(attr, part, len(prefixes), optional)
        return tensors

    def to_param_layout(self, attr: str, tensors: Sequence[np.ndarray]) -> np.ndarray:
        (tensor,) = tensors
        return tensor.reshape(getattr(self, attr).shape)


@dataclasses.dataclass(frozen=True)
class HFTensor:
    """What one checkpoint tensor fills: part `part` of the `num_parts` that param `attr`
    joins (in `to_param_layout`'s order); `optional`: a checkpoint may lack it."""

    attr: str
    part: int = 0
    num_parts: int = 1
    optional: bool = False
