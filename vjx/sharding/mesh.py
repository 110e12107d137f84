"""The device mesh of one engine replica, built from `ParallelConfig`.

Axes are `data` and `model`. Tensor parallelism spreads heads, MLP width and vocabulary over
`model` (see rules.py). Data parallelism runs independent engine replicas, each with its own
scheduler and KV pool, so one replica's mesh has `data` of size 1; replica r takes its host's
(r - data_parallel_start_rank)-th group of consecutive devices. Keeping the `data` axis on every mesh
lets the same specs serve a mesh that later batches several replicas in one program.
"""

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from vjx.config import ParallelConfig

MESH_AXES = ("data", "model")
"""Mesh axis names, outermost first."""


def device_groups(parallel_config: ParallelConfig, devices: Sequence | None = None) -> list[list]:
    """The devices of each data-parallel replica on this host: `local_data_parallel_size`
    disjoint groups of `pipeline_parallel_size` x `tensor_parallel_size` devices (stage by
    stage), taken in order from `devices` (default: `jax.devices()`)."""
    devices = list(jax.devices() if devices is None else devices)
    tp, pp, dp = (
        parallel_config.tensor_parallel_size,
        parallel_config.pipeline_parallel_size,
        parallel_config.local_data_parallel_size,
    )
    if min(tp, pp, dp) < 1:
        raise ValueError(
            f"tensor_parallel_size, pipeline_parallel_size and data_parallel_size must be >= 1, got {tp}, {pp}, {dp}."
        )
    size = tp * pp
    if size * dp > len(devices):
        raise ValueError(
            f"tensor_parallel_size x pipeline_parallel_size x data_parallel_size = {tp} x {pp} x {dp} = "
            f"{size * dp} devices, but only {len(devices)} are available; use at most {len(devices)}."
        )
    return [devices[rank * size : (rank + 1) * size] for rank in range(dp)]


def make_mesh(parallel_config: ParallelConfig, devices: Sequence | None = None) -> Mesh:
    """The mesh of replica `parallel_config.data_parallel_rank`: shape (1, tensor_parallel_size)
    (with pipeline stages, the first stage's; see `make_stage_meshes`)."""
    return make_stage_meshes(parallel_config, devices)[0]


def make_stage_meshes(parallel_config: ParallelConfig, devices: Sequence | None = None) -> list[Mesh]:
    """One mesh per pipeline stage of replica `parallel_config.data_parallel_rank`, each of
    shape (1, tensor_parallel_size), on consecutive devices of the replica's group."""
    groups = device_groups(parallel_config, devices)
    rank, first = parallel_config.data_parallel_rank, parallel_config.data_parallel_start_rank
    if not first <= rank < first + len(groups):
        raise ValueError(f"data_parallel_rank must be in [{first}, {first + len(groups) - 1}], got {rank}.")
    # Auto axes: XLA propagates shardings from the params and the few constraints the model
    # sets, as the rules table intends (Explicit axes would demand a spec for every op).
    stages = np.asarray(groups[rank - first], dtype=object).reshape(parallel_config.pipeline_parallel_size, 1, -1)
    return [Mesh(stage, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES)) for stage in stages]


def model_axis_size(mesh: Mesh | None) -> int:
    """Devices along `model` (1 without a mesh or without that axis)."""
    if mesh is None or "model" not in mesh.axis_names:
        return 1
    return mesh.shape["model"]
