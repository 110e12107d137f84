"""StepProfiler: where the host's time per engine step goes (`profile_host=True`).

It wraps the four calls a step makes, without a branch in `EngineCore.step`:
- `schedule`: the scheduler plans the step;
- `execute`: the model runner fills the packed inputs and dispatches the compiled step (on a
  GPU this returns before the device finishes unless the step makes XLA wait for it);
- `collect`: waiting for the step's tokens and appending them (mostly the device's time);
- `update`: the scheduler applies the tokens.
`schedule + execute + update` is host work that async scheduling overlaps with the device;
the engine keeps up with the device while it stays below the device's time per step. Every
`interval` steps one log line gives the means per step, and `means()` returns them.
"""

import collections
import functools
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

PHASES = ("schedule", "execute", "collect", "update")


class StepProfiler:
    def __init__(self, interval: int = 100):
        self.interval = interval
        self.reset()

    def reset(self) -> None:
        """Starts counting afresh (e.g. after a benchmark's warm-up)."""
        self.num_steps = 0
        self._seconds: dict[str, float] = collections.defaultdict(float)
        self._start = time.perf_counter()

    def timed(self, phase: str, fn: Callable) -> Callable:
        """`fn`, adding its wall time to `phase`."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._seconds[phase] += time.perf_counter() - start

        return wrapper

    def step_done(self) -> None:
        self.num_steps += 1
        if self.num_steps % self.interval == 0:
            means = self.means()
            phases = ", ".join(f"{name} {means[name] * 1e3:.2f}" for name in PHASES)
            logger.info(
                "host profile over %d steps, ms per step: %s; host %.2f of %.2f wall",
                self.num_steps, phases, means["host"] * 1e3, means["wall"] * 1e3,
            )

    def means(self) -> dict[str, float]:
        """Seconds per step since the start: each phase, `host` (schedule + execute + update)
        and `wall` (elapsed time over steps, idle time included)."""
        steps = max(self.num_steps, 1)
        means = {name: self._seconds[name] / steps for name in PHASES}
        means["host"] = means["schedule"] + means["execute"] + means["update"]
        means["wall"] = (time.perf_counter() - self._start) / steps
        return means
