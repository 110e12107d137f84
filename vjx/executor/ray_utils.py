"""The ranks of an engine over several hosts as Ray actors (distributed_executor_backend="ray").

vLLM's pattern: the engine process (rank 0, on the node where `vjx serve` runs) connects to
the running Ray cluster, reserves one placement-group bundle per host (bundle 0 on its own
node, for its own devices), and starts ranks 1 .. nnodes - 1 as actors in the other bundles.
Each actor runs `run_worker`, exactly what `vjx serve --headless` runs: it joins
`jax.distributed` at rank 0's address, takes rank 0's config and runs its calls. Ray only
places and starts the processes; the step, its collectives and the control channel are the
"mp" executor's (multiproc.py).
"""

import dataclasses
import logging

from vjx import process_setup
from vjx.config import ParallelConfig
from vjx.distributed import channel
from vjx.engine_args import EngineArgs
from vjx.executor.multiproc_worker import run_worker

logger = logging.getLogger(__name__)

_PLACEMENT_TIMEOUT_S = 120.0
_ENV_FOR_RANKS = ("XLA_FLAGS", "JAX_PLATFORMS")
"""This process's environment that a rank must start with to build the same devices."""


class RankActor:
    """One rank > 0 in its Ray actor: its `run` is the rank's whole life."""

    def run(self, parallel_config: ParallelConfig, cache_options: dict) -> None:
        run_worker(parallel_config, cache_options)


def _bundles(ray, head_ip: str, nnodes: int, devices_per_host: int) -> tuple[list[dict], str]:
    """One bundle per host: its GPUs (each bundle on its own node), or on a CPU cluster one CPU."""
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    bundle = {"GPU": devices_per_host} if has_gpus else {"CPU": 1}
    bundles = [{**bundle, f"node:{head_ip}": 0.001}] + [dict(bundle) for _ in range(nnodes - 1)]
    return bundles, "STRICT_SPREAD" if has_gpus else "PACK"


def initialize_ray_cluster(engine_args: EngineArgs) -> EngineArgs:
    """Starts ranks 1 .. nnodes - 1 on the Ray cluster; returns `engine_args` with rank 0's
    address and ports, for this process to join them."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        # Connects to the cluster of `ray start --head` (or of RAY_ADDRESS); never starts one.
        ray.init(address="auto", logging_level=logging.WARNING, log_to_driver=False)
    head_ip = ray.util.get_node_ip_address()
    nnodes, devices_per_host = engine_args.nnodes, engine_args.tensor_parallel_size // engine_args.nnodes
    bundles, strategy = _bundles(ray, head_ip, nnodes, devices_per_host)
    group = placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=_PLACEMENT_TIMEOUT_S)
    if not ready:
        raise RuntimeError(
            f"the Ray cluster has no room for {nnodes} hosts' bundles {bundles} ({strategy}) "
            f"after {_PLACEMENT_TIMEOUT_S:.0f} s: its resources are {ray.cluster_resources()}."
        )
    engine_args = dataclasses.replace(engine_args, master_addr=head_ip, master_port=channel.free_ports(head_ip))
    parallel_config = engine_args.create_parallel_config()
    env = {name: value for name in _ENV_FOR_RANKS if (value := process_setup.environment(name)) is not None}
    actor_class = ray.remote(RankActor)
    for rank in range(1, nnodes):
        actor = actor_class.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
            num_cpus=bundles[rank].get("CPU", 0),
            num_gpus=bundles[rank].get("GPU", 0),
            runtime_env={"env_vars": env},
            name=f"vjx-rank{rank}",
        ).remote()
        rank_config = dataclasses.replace(parallel_config, node_rank=rank)
        actor.run.remote(rank_config, process_setup.compilation_cache_options())
    logger.info("Ray: ranks 1..%d started, rank 0 at %s:%d", nnodes - 1, head_ip, engine_args.master_port)
    return engine_args
