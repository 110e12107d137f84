"""Joining an engine's processes into one JAX runtime (`jax.distributed`).

An engine over `nnodes` hosts runs one process per host. Each calls `initialize` before
anything starts JAX's backends: process `node_rank` connects to the coordinator that rank 0
serves at `master_addr:master_port`, and from then on `jax.devices()` lists every process's
devices, so one mesh spans them and every process runs the same compiled step on its own
devices. On CPU the processes' collectives run over gloo (TCP).

vjx's own control channel (vjx/distributed/channel.py) takes the next two ports.
"""

import logging

import jax

from vjx.config import ParallelConfig

logger = logging.getLogger(__name__)

_INITIALIZATION_TIMEOUT_S = 300
"""How long a process waits for all `nnodes` to join (hosts start in any order)."""
_HEARTBEAT_TIMEOUT_S = 10
"""JAX's own liveness check; vjx's channel notices a dead process sooner (channel.py)."""
_SHUTDOWN_TIMEOUT_S = 10
"""How long a process that exits waits at JAX's shutdown barrier for the others."""


def initialize(parallel_config: ParallelConfig) -> None:
    """Joins this process to the engine's JAX runtime; a no-op on one host or when joined."""
    if parallel_config.nnodes == 1 or jax.distributed.is_initialized():
        return
    # Only the CPU client reads it; without it CPU devices of several processes cannot talk.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logger.info(
        "joining %s:%d as process %d of %d",
        parallel_config.master_addr,
        parallel_config.master_port,
        parallel_config.node_rank,
        parallel_config.nnodes,
    )
    jax.distributed.initialize(
        coordinator_address=f"{parallel_config.master_addr}:{parallel_config.master_port}",
        num_processes=parallel_config.nnodes,
        process_id=parallel_config.node_rank,
        initialization_timeout=_INITIALIZATION_TIMEOUT_S,
        heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT_S,
        shutdown_timeout_seconds=_SHUTDOWN_TIMEOUT_S,
    )
    # Starting a backend is collective (the processes trade their device lists): all start now.
    logger.info("%d devices over %d processes", len(jax.devices()), jax.process_count())
