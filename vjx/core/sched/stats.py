"""SchedulerStats: what the scheduler reports for logging and metrics."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class SchedulerStats:
    """The scheduler's state now (gauges) and its work over an interval (counts).

    `Scheduler.make_stats()` returns the counts since its previous call, so a logger that
    calls it every few seconds reports rates over that window.
    """

    num_running_reqs: int
    num_waiting_reqs: int
    """Waiting requests, preempted ones included."""
    kv_cache_usage: float
    """Fraction of the usable KV blocks that requests hold, in [0, 1]."""
    num_steps: int = 0
    """Steps that computed at least one token."""
    num_scheduled_tokens: int = 0
    num_preemptions: int = 0
    num_prefix_queried_tokens: int = 0
    """Tokens of waiting requests looked up in the prefix cache (a lookup per admission try)."""
    num_prefix_hit_tokens: int = 0
    sleep_level: int | None = None
    """The engine's sleep level (`EngineCore.sleep`; 0 pauses scheduling only), None when awake."""

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens over queried tokens; 0 when nothing was looked up."""
        if not self.num_prefix_queried_tokens:
            return 0.0
        return self.num_prefix_hit_tokens / self.num_prefix_queried_tokens

    @property
    def num_tokens_per_step(self) -> float:
        """Mean tokens computed per step; 0 when no step ran."""
        return self.num_scheduled_tokens / self.num_steps if self.num_steps else 0.0

    def since(self, previous: "SchedulerStats") -> "SchedulerStats":
        """These gauges, with the counts accumulated after `previous` (both running totals)."""
        return dataclasses.replace(
            self,
            num_steps=self.num_steps - previous.num_steps,
            num_scheduled_tokens=self.num_scheduled_tokens - previous.num_scheduled_tokens,
            num_preemptions=self.num_preemptions - previous.num_preemptions,
            num_prefix_queried_tokens=(self.num_prefix_queried_tokens - previous.num_prefix_queried_tokens),
            num_prefix_hit_tokens=self.num_prefix_hit_tokens - previous.num_prefix_hit_tokens,
        )

    def __str__(self) -> str:
        """One log line, in the words of vLLM's periodic stats log."""
        return (
            f"Running: {self.num_running_reqs} reqs, Waiting: {self.num_waiting_reqs} reqs, "
            f"KV cache usage: {self.kv_cache_usage:.1%}, "
            f"Prefix cache hit rate: {self.prefix_cache_hit_rate:.1%}, "
            f"Preemptions: {self.num_preemptions}, "
            f"Tokens per step: {self.num_tokens_per_step:.1f} over {self.num_steps} steps"
        )
