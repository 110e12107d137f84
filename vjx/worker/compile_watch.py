"""Fails loudly when XLA compiles anything inside a serving step.

Every step variant is compiled ahead of the first request; a compile inside a step means a
shape or a static argument escaped the bucket set and would stall serving for seconds.
Only compiles on the stepping thread, inside the `with` block, count: the user's own JAX
work between steps is none of the engine's business. A watch that is not strict only counts
(the executable cache asks whether a compile was fresh or served by JAX's persistent cache).
"""

import threading

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# A compile that JAX's persistent cache served: counted in num_compiles too.
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_local = threading.local()


def _on_event(event: str, duration: float, **kwargs) -> None:
    watch = getattr(_local, "watch", None)
    if event == _COMPILE_EVENT and watch is not None:
        watch.num_compiles += 1


def _on_cache_hit(event: str, **kwargs) -> None:
    watch = getattr(_local, "watch", None)
    if event == _CACHE_HIT_EVENT and watch is not None:
        watch.num_cache_hits += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)
jax.monitoring.register_event_listener(_on_cache_hit)


class CompileWatch:
    """`with watch:` counts XLA compiles inside the block and, when strict, raises
    RuntimeError if there was any."""

    def __init__(self, is_strict: bool = True):
        self.num_compiles = 0
        self.num_cache_hits = 0
        self.is_strict = is_strict

    def __enter__(self) -> "CompileWatch":
        _local.watch = self
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _local.watch = None
        if exc_type is None and self.num_compiles and self.is_strict:
            raise RuntimeError(
                f"{self.num_compiles} XLA compilation(s) happened while serving: a step input "
                "fell outside the compiled buckets."
            )
