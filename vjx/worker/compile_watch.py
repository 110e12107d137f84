"""Fails loudly when XLA compiles anything inside a serving step.

Every step variant is compiled ahead of the first request; a compile inside a step means a
shape or a static argument escaped the bucket set and would stall serving for seconds.
Only compiles on the stepping thread, inside the `with` block, count: the user's own JAX
work between steps is none of the engine's business.
"""

import threading

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_local = threading.local()


def _on_event(event: str, duration: float, **kwargs) -> None:
    watch = getattr(_local, "watch", None)
    if event == _COMPILE_EVENT and watch is not None:
        watch.num_compiles += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


class CompileWatch:
    """`with watch:` raises RuntimeError if XLA compiled anything inside the block."""

    def __init__(self):
        self.num_compiles = 0

    def __enter__(self) -> "CompileWatch":
        _local.watch = self
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _local.watch = None
        if exc_type is None and self.num_compiles:
            raise RuntimeError(
                f"{self.num_compiles} XLA compilation(s) happened while serving: a step input "
                "fell outside the compiled buckets."
            )
