"""MultiprocExecutor: rank 0 of an engine whose devices span several processes (hosts).

Every process joined `jax.distributed` (vjx/distributed/jax_distributed.py), so the mesh
spans all their devices and each process drives its own. Rank 0 runs EngineCore (scheduler,
front end) and its own `Worker`; the other ranks run `WorkerProc` (multiproc_worker.py), a
`Worker` with nothing but a loop over rank 0's calls. Rank 0 sends each call to every rank
before running it itself, so all ranks trace, compile and run the same programs in the same
order (the collectives of the step join them). Each rank's runner keeps its own copy of the
persistent batch, updated from the same `SchedulerOutput`s and the same sampled tokens,
which every rank reads from its replicated output; only rank 0's output goes to the
scheduler.
"""

import logging
import pickle
import time
from collections.abc import Callable
from typing import Any

import zmq

from vjx.config import VjxConfig
from vjx.core.sched.output import SchedulerOutput
from vjx.distributed import channel
from vjx.executor.abstract import Executor
from vjx.kv_cache_interface import KVCacheConfig
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vjx.worker.worker import Worker

logger = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 120.0
"""How long rank 0 waits for every rank's hello once `jax.distributed` has joined them."""
_SHUTDOWN_TIMEOUT_S = 5.0
"""How long rank 0's shutdown waits for the other ranks to say they are leaving."""
_EXIT_GRACE_S = 0.5
"""After the last rank's goodbye: the time it takes to exit, before rank 0 may."""
EXECUTE, COLLECT, SHUTDOWN = "execute_model", "collect", "shutdown"
"""The calls a rank runs without answering (shutdown: it answers, then exits); any other name
is a `Worker` method."""


class MultiprocExecutor(Executor):
    def __init__(self, config: VjxConfig):
        super().__init__(config)
        parallel_config = config.parallel_config
        self.context = zmq.Context()
        self.heartbeat = channel.rank_heartbeat_server(self.context, parallel_config)
        self.control = self.context.socket(zmq.ROUTER)
        self.control.bind(channel.control_address(parallel_config))
        self.identities = [channel.rank_identity(rank) for rank in range(1, parallel_config.nnodes)]
        self._join()
        self._send((config,))
        self.worker = Worker(config)

    def _join(self) -> None:
        """Waits for each rank's hello, so no call is sent before a rank can receive it."""
        missing, deadline = set(self.identities), time.monotonic() + _JOIN_TIMEOUT_S
        while missing:
            if not self.control.poll(int(max(deadline - time.monotonic(), 0) * 1000)):
                names = ", ".join(sorted(identity.decode() for identity in missing))
                raise RuntimeError(f"{names} did not reach rank 0's control channel within {_JOIN_TIMEOUT_S:.0f} s.")
            identity, _ = self.control.recv_multipart()
            missing.discard(identity)

    def _send(self, call: tuple) -> None:
        """One call to every other rank: (config,) first, then (method, args, kwargs)."""
        try:
            frame = pickle.dumps(call)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise ValueError(f"{call[0]!r} cannot be sent to the other processes: {e}") from e
        for identity in self.identities:
            self.control.send_multipart([identity, frame])

    def _gather(self, method: str) -> list[Any]:
        """The other ranks' answers to `method`, in rank order."""
        replies = {}
        while len(replies) < len(self.identities):
            _, frame = self.control.recv_multipart()
            reply = channel.decode_reply(frame)
            replies[reply["rank"]] = reply
        for rank, reply in sorted(replies.items()):
            if reply["error"] is not None:
                raise RuntimeError(f"{method} failed on rank {rank}: {reply['error']}")
        return [reply["result"] for _, reply in sorted(replies.items())]

    def determine_kv_cache_config(self) -> KVCacheConfig:
        """As many blocks as the fullest process's devices hold."""
        num_blocks = min(self.collective_rpc("determine_num_available_blocks"))
        return KVCacheConfig(num_blocks, self.worker.kv_cache_groups, self.worker.num_state_slots)

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> float:
        self.collective_rpc("initialize_from_config", args=(kv_cache_config,))
        return max(self.collective_rpc("compile_or_warm_up_model"))

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        self._send((EXECUTE, (scheduler_output,), {}))
        future = self.worker.execute_model(scheduler_output, non_block=True)
        output = AsyncModelRunnerOutput(lambda: self._collect(future))
        return output if non_block else output.get_output()

    def _collect(self, future: AsyncModelRunnerOutput) -> ModelRunnerOutput:
        # Every rank collects its steps in rank 0's order: collecting updates the runner's batch.
        self._send((COLLECT, (), {}))
        return future.get_output()

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Rank 0's result, then the other ranks' in rank order. A function goes to the other
        ranks as a pickle (so by reference: a module-level function, not a lambda), and their
        results come back in msgpack (numbers, strings, lists, dicts)."""
        kwargs = kwargs or {}
        self._send((method, args, kwargs))
        if isinstance(method, str):
            result = getattr(self.worker, method)(*args, **kwargs)
        else:
            result = method(self.worker, *args, **kwargs)
        name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        return [result, *self._gather(name)]

    @property
    def is_sleeping(self) -> bool:
        # Every rank sleeps and wakes with rank 0.
        return self.worker.is_sleeping

    def sleep(self, level: int = 1) -> None:
        raise ValueError(
            f"sleep level {level} is not built for an engine over several processes: its weights would "
            "go to host memory on every host (level 0 pauses scheduling and works)."
        )

    def shutdown(self) -> None:
        """Ends the other ranks' loops, then closes the channel; idempotent."""
        if self.context.closed:
            return
        self.heartbeat.stop()
        self._send((SHUTDOWN, (), {}))
        # Rank 0 hosts JAX's coordinator: the others leave first, or they would see it vanish.
        deadline = time.monotonic() + _SHUTDOWN_TIMEOUT_S
        for _ in self.identities:
            if not self.control.poll(int(max(deadline - time.monotonic(), 0) * 1000)):
                break
            self.control.recv_multipart()
        time.sleep(_EXIT_GRACE_S)
        self.control.close(linger=0)
        self.context.term()
