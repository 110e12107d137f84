"""The checks of EngineArgs' layout over processes and hosts: an engine over several hosts
(`nnodes`, the "mp" and "ray" executors) and data-parallel replicas over several hosts."""

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vjx.engine_args import EngineArgs


def verify_multi_node(args: "EngineArgs") -> None:
    if args.nnodes < 1:
        raise ValueError(f"nnodes must be >= 1, got {args.nnodes}.")
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"node_rank must be in [0, {args.nnodes - 1}] (nnodes={args.nnodes}), got {args.node_rank}.")
    if not 1 <= args.master_port <= 65533:
        raise ValueError(
            f"master_port must be in [1, 65533] (vjx takes the next two ports too), got {args.master_port}."
        )
    if args.distributed_executor_backend == "ray":
        _verify_ray(args)
    if args.nnodes == 1:
        return
    if args.distributed_executor_backend == "uni":
        raise ValueError(
            f"distributed_executor_backend='uni' drives one host's devices; nnodes={args.nnodes} needs 'mp'."
        )
    if args.data_parallel_size > 1:
        raise ValueError(
            f"data_parallel_size={args.data_parallel_size} with nnodes={args.nnodes}: an engine over several "
            "hosts serves tensor parallelism; for replicas on several hosts leave nnodes at 1 and set "
            "data_parallel_size_local (and on the other hosts `vjx serve --headless "
            "--data-parallel-start-rank ...`)."
        )
    if args.multiprocess is False:
        raise ValueError(f"multiprocess=False with nnodes={args.nnodes}: rank 0's engine runs in its own process.")


def verify_data_parallel(args: "EngineArgs") -> None:
    """The replicas of this host are ranks [start, start + local) of data_parallel_size."""
    size, start = args.data_parallel_size, args.data_parallel_start_rank or 0
    local = size if args.data_parallel_size_local is None else args.data_parallel_size_local
    if not 0 <= start < size:
        raise ValueError(f"data_parallel_start_rank must be in [0, {size - 1}], got {start}.")
    if not 1 <= local <= size - start:
        raise ValueError(
            f"data_parallel_size_local must be in [1, {size - start}] (data_parallel_size={size}, "
            f"data_parallel_start_rank={start}), got {local}."
        )
    port = args.data_parallel_rpc_port
    if port is not None and not 1 <= port <= 65533:
        raise ValueError(f"data_parallel_rpc_port must be in [1, 65533] (vjx takes the next two too), got {port}.")
    if local < size and args.multiprocess is False:
        raise ValueError(
            f"multiprocess=False with data_parallel_size_local={local} < data_parallel_size={size}: the "
            "replicas on other hosts are reached from engine processes."
        )


def _verify_ray(args: "EngineArgs") -> None:
    if importlib.util.find_spec("ray") is None:
        raise ValueError("distributed_executor_backend='ray' needs Ray: pip install 'vjx[ray]'.")
    if args.tensor_parallel_size % args.nnodes:
        raise ValueError(
            f"distributed_executor_backend='ray' gives each of nnodes={args.nnodes} hosts the same "
            f"number of devices: tensor_parallel_size must be a multiple of it, got {args.tensor_parallel_size}."
        )
