"""Sharding constraints on activations, read against the mesh of the trace.

The step is traced under `jax.set_mesh(mesh)`; these helpers then pin an activation's layout
by its logical axes (through rules.py) and do nothing when no mesh is set, so model code calls
them unconditionally and still runs unsharded (e.g. in a unit test).
"""

from collections.abc import Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

from vjx.sharding.rules import logical_to_mesh_axes


def _current_mesh():
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def mesh_spec(mesh, logical_axes: Sequence[str | None]) -> PartitionSpec:
    """The table's `PartitionSpec` for `logical_axes`, without mesh axes `mesh` lacks."""
    spec = logical_to_mesh_axes(logical_axes)
    return PartitionSpec(*(axis if axis in mesh.axis_names else None for axis in spec))


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """`x` laid out as the rules table says for `logical_axes` (a no-op without a mesh)."""
    mesh = _current_mesh()
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, mesh_spec(mesh, logical_axes)))


def replicate(x: jax.Array) -> jax.Array:
    """`x` whole on every device of the mesh: e.g. the gathered logits rows the sampler reads."""
    return constrain(x, (None,) * x.ndim)
