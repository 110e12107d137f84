"""StepProfiler: where the host's time per engine step goes (`profile_host=True`).

`EngineCore` runs each step in four named phases, `with profiler.phase(name):`
- `schedule`: the scheduler plans the step;
- `execute`: the model runner fills the packed inputs and dispatches the compiled step (on a
  GPU this returns before the device finishes unless the step makes XLA wait for it);
- `collect`: waiting for the step's tokens and appending them (mostly the device's time);
- `update`: the scheduler applies the tokens.
`schedule + execute + update` is host work that async scheduling overlaps with the device;
the engine keeps up with the device while it stays below the device's time per step. Every
`interval` steps one log line gives the means per step, and `means()` returns them. With
`profile_host` off the engine holds a `NullStepProfiler`, whose phases do nothing, so
`EngineCore.step` reads the same either way.
"""

import collections
import contextlib
import logging
import time

from vjx.metrics.utilization import UtilizationMeter

logger = logging.getLogger(__name__)

PHASES = ("schedule", "execute", "collect", "update")


class _PhaseTimer:
    """Adds the wall time of its `with` block to one phase (phases never nest)."""

    __slots__ = ("_profiler", "_name", "_start")

    def __init__(self, profiler: "StepProfiler", name: str):
        self._profiler = profiler
        self._name = name
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc_info) -> None:
        self._profiler._seconds[self._name] += time.perf_counter() - self._start


class StepProfiler:
    def __init__(self, interval: int = 100, utilization: UtilizationMeter | None = None):
        """`utilization`: the engine's UtilizationMeter (None: no MBU / MFU in the line)."""
        self.interval = interval
        self.utilization = utilization
        self._timers = {name: _PhaseTimer(self, name) for name in PHASES}
        self.reset()

    def reset(self) -> None:
        """Starts counting afresh (e.g. after a benchmark's warm-up)."""
        self.num_steps = 0
        self._seconds: dict[str, float] = collections.defaultdict(float)
        self._start = time.perf_counter()

    def phase(self, name: str) -> _PhaseTimer:
        """A context manager adding its block's wall time to phase `name`."""
        timer = self._timers.get(name)
        if timer is None:
            raise ValueError(f"phase must be one of {PHASES}, got {name!r}.")
        return timer

    def step_done(self) -> None:
        self.num_steps += 1
        if self.num_steps % self.interval == 0:
            means = self.means()
            phases = ", ".join(f"{name} {means[name] * 1e3:.2f}" for name in PHASES)
            logger.info(
                "host profile over %d steps, ms per step: %s; host %.2f of %.2f wall%s",
                self.num_steps,
                phases,
                means["host"] * 1e3,
                means["wall"] * 1e3,
                self._utilization_line(),
            )

    def _utilization_line(self) -> str:
        if self.utilization is None:
            return ""
        figures = self.utilization.lifetime()
        parts = [(name, value) for name, value in (("MBU", figures.mbu), ("MFU", figures.mfu)) if value is not None]
        return "".join(f"; {name} {value:.1%}" for name, value in parts)

    def means(self) -> dict[str, float]:
        """Seconds per step since the start: each phase, `host` (schedule + execute + update)
        and `wall` (elapsed time over steps, idle time included)."""
        steps = max(self.num_steps, 1)
        means = {name: self._seconds[name] / steps for name in PHASES}
        means["host"] = means["schedule"] + means["execute"] + means["update"]
        means["wall"] = (time.perf_counter() - self._start) / steps
        return means


class NullStepProfiler:
    """The profiler of an engine without `profile_host`: every phase and step is a no-op."""

    _NO_OP = contextlib.nullcontext()

    def phase(self, name: str) -> contextlib.nullcontext:
        return self._NO_OP

    def step_done(self) -> None:
        pass
