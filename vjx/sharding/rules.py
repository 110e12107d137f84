"""The one table that maps the models' logical axis names to mesh axes.

Model code names what each array dimension means (`heads`, `mlp`, ...); only this table says
how those dimensions are spread over the device mesh. Tensor parallelism shards attention
heads, KV heads, MLP width and the vocabulary over the `model` axis (Megatron-style: column
parallel in, row parallel out); everything else is replicated. The `experts` dimension of a
MoE layer's stacked weights is on `model` too: with expert parallelism whole experts sit on
each device; without it the experts' weights carry no `experts` name and split on `mlp`. XLA inserts the collectives
the layouts imply: an all-reduce after each row-parallel projection and after the
vocab-parallel embedding lookup, an all-gather of the logits rows before sampling.
"""

from collections.abc import Sequence

from jax.sharding import Mesh, NamedSharding, PartitionSpec

LOGICAL_AXIS_RULES: dict[str, str | None] = {
    "tokens": None,
    "embed": None,
    "vocab": "model",
    "heads": "model",
    "kv_heads": "model",
    "head_dim": None,
    "qkv": None,
    "mlp": "model",
    "experts": "model",
    "norm": None,
}
"""Logical axis name -> mesh axis name (None: replicated along that dimension)."""


def logical_to_mesh_axes(logical_axes: Sequence[str | None]) -> PartitionSpec:
    """The `PartitionSpec` of an array whose dimensions carry `logical_axes`.

    A None entry is a dimension without a name and is replicated.
    """
    mesh_axes = []
    for name in logical_axes:
        if name is not None and name not in LOGICAL_AXIS_RULES:
            raise ValueError(f"logical_axes holds {name!r}, which is not one of {sorted(LOGICAL_AXIS_RULES)}.")
        mesh_axes.append(None if name is None else LOGICAL_AXIS_RULES[name])
    return PartitionSpec(*mesh_axes)


def logical_sharding(mesh: Mesh, logical_axes: Sequence[str | None]) -> NamedSharding:
    """The `NamedSharding` on `mesh` of an array whose dimensions carry `logical_axes`.

    Mesh axes the mesh does not have (e.g. `model` on a data-parallel-only mesh) are dropped,
    so the same table serves every mesh shape.
    """
    spec = logical_to_mesh_axes(logical_axes)
    present = [axis if axis in mesh.axis_names else None for axis in spec]
    return NamedSharding(mesh, PartitionSpec(*present))
