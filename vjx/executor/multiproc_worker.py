"""WorkerProc: a rank other than 0 of an engine over several processes (see multiproc.py).

It joins `jax.distributed`, says hello on rank 0's control channel, takes rank 0's config
(so every rank compiles the same step shapes; only the connection flags come from its own
command line), builds its `Worker` and runs each call rank 0 sends, in order, until rank 0
says shutdown. A failing step ends the process: rank 0 notices the silence and stops the
engine, as it would for a dead host (a failing `collective_rpc` only answers its error).
"""

import collections
import dataclasses
import logging
import os
import pickle
import traceback

import zmq

from vjx import process_setup
from vjx.config import ParallelConfig
from vjx.distributed import channel, jax_distributed
from vjx.executor.multiproc import COLLECT, EXECUTE, SHUTDOWN
from vjx.worker.worker import Worker

logger = logging.getLogger(__name__)

_LINGER_MS = 2000


class WorkerProc:
    def __init__(self, parallel_config: ParallelConfig):
        self.rank = parallel_config.node_rank
        self.context = zmq.Context()
        self.heartbeat = channel.rank_heartbeat_client(self.context, parallel_config)
        self.control = self.context.socket(zmq.DEALER)
        self.control.setsockopt(zmq.IDENTITY, channel.rank_identity(self.rank))
        self.control.connect(channel.control_address(parallel_config))
        self.control.send(b"hello")
        (config,) = self._receive()
        config = dataclasses.replace(
            config, parallel_config=dataclasses.replace(config.parallel_config, node_rank=self.rank)
        )
        self.worker = Worker(config)
        process_setup.set_random_seed(config.model_config.seed, config.parallel_config.data_parallel_rank)
        self.futures = collections.deque()

    def _receive(self) -> tuple:
        return pickle.loads(self.control.recv())

    def run(self) -> None:
        """Runs rank 0's calls until it says shutdown."""
        while True:
            method, args, kwargs = self._receive()
            if method == SHUTDOWN:
                break
            if method == EXECUTE:
                self.futures.append(self.worker.execute_model(*args, non_block=True))
            elif method == COLLECT:
                self.futures.popleft().get_output()
            else:
                self.control.send(self._call(method, args, kwargs))
        self.heartbeat.stop()
        # The answer says this rank is about to exit: closing the context sends it first.
        self.control.send(channel.encode_reply(self.rank))
        self.control.close(linger=_LINGER_MS)
        self.context.term()

    def _call(self, method, args: tuple, kwargs: dict) -> bytes:
        try:
            if isinstance(method, str):
                result = getattr(self.worker, method)(*args, **kwargs)
            else:
                result = method(self.worker, *args, **kwargs)
        except Exception as e:
            logger.exception("%s failed on rank %d", method, self.rank)
            return channel.encode_reply(self.rank, error=f"{type(e).__name__}: {e}")
        return channel.encode_reply(self.rank, result)


def run_worker(parallel_config: ParallelConfig, cache_options: dict | None = None) -> None:
    """The entry point of rank `parallel_config.node_rank` > 0 (`vjx serve --headless`, or a
    Ray actor); `cache_options` are rank 0's compilation cache options (default: vjx's)."""
    process_setup.setup_engine_process(cache_options or {}, None)
    jax_distributed.initialize(parallel_config)
    try:
        proc = WorkerProc(parallel_config)
    except Exception:
        logger.error("rank %d could not start:\n%s", parallel_config.node_rank, traceback.format_exc())
        raise
    logger.info("rank %d of %d ready", parallel_config.node_rank, parallel_config.nnodes)
    proc.run()
    logging.shutdown()
    # Not through JAX's exit barrier: rank 0, which serves it, is leaving too.
    os._exit(0)
