"""SchedulerStats: what the scheduler reports for logging and metrics."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class SpecDecodingStats:
    """Speculative decoding's counts (vLLM's `SpecDecodingStats`): drafts verified (requests
    with at least one draft token in a step), their tokens, the tokens accepted, and per draft
    position the drafts accepted up to it."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: tuple[int, ...] = ()

    def observe_draft(self, num_draft_tokens: int, num_accepted: int) -> "SpecDecodingStats":
        per_pos = list(self.num_accepted_tokens_per_pos)
        per_pos += [0] * (num_draft_tokens - len(per_pos))
        for position in range(num_accepted):
            per_pos[position] += 1
        return SpecDecodingStats(
            self.num_drafts + 1,
            self.num_draft_tokens + num_draft_tokens,
            self.num_accepted_tokens + num_accepted,
            tuple(per_pos),
        )

    def _combine(self, other: "SpecDecodingStats", sign: int) -> "SpecDecodingStats":
        width = max(len(self.num_accepted_tokens_per_pos), len(other.num_accepted_tokens_per_pos))
        mine, theirs = (list(s.num_accepted_tokens_per_pos) + [0] * width for s in (self, other))
        return SpecDecodingStats(
            self.num_drafts + sign * other.num_drafts,
            self.num_draft_tokens + sign * other.num_draft_tokens,
            self.num_accepted_tokens + sign * other.num_accepted_tokens,
            tuple(a + sign * b for a, b in zip(mine[:width], theirs[:width])),
        )

    def __add__(self, other: "SpecDecodingStats") -> "SpecDecodingStats":
        return self._combine(other, 1)

    def __radd__(self, other) -> "SpecDecodingStats":
        """`sum()` over replicas starts from 0."""
        return self if other == 0 else self._combine(other, 1)

    def __sub__(self, other: "SpecDecodingStats") -> "SpecDecodingStats":
        return self._combine(other, -1)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verified draft, the bonus token included (vLLM's log line); 0 without drafts."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


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
    spec_decoding_stats: SpecDecodingStats = SpecDecodingStats()
    sleep_level: int | None = None
    """The engine's sleep level (`EngineCore.sleep`; 0 pauses scheduling only), None when awake."""
    mbu: float | None = None
    """Model bandwidth utilization over the window (vjx/metrics/utilization.py); None: unknown."""
    mfu: float | None = None
    """Model FLOP utilization over the window; None: unknown."""

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
            spec_decoding_stats=self.spec_decoding_stats - previous.spec_decoding_stats,
        )

    def __str__(self) -> str:
        """One log line, in the words of vLLM's periodic stats log."""
        return (
            f"Running: {self.num_running_reqs} reqs, Waiting: {self.num_waiting_reqs} reqs, "
            f"KV cache usage: {self.kv_cache_usage:.1%}, "
            f"Prefix cache hit rate: {self.prefix_cache_hit_rate:.1%}, "
            f"Preemptions: {self.num_preemptions}, "
            f"Tokens per step: {self.num_tokens_per_step:.1f} over {self.num_steps} steps"
            + "".join(
                f", {name.upper()}: {value:.1%}"
                for name, value in (("mbu", self.mbu), ("mfu", self.mfu))
                if value is not None
            )
            + self._spec_decoding_line()
        )

    def _spec_decoding_line(self) -> str:
        spec = self.spec_decoding_stats
        if not spec.num_drafts:
            return ""
        rate = spec.num_accepted_tokens / spec.num_draft_tokens
        per_pos = ", ".join(f"{n / spec.num_drafts:.3f}" for n in spec.num_accepted_tokens_per_pos)
        return (
            f", SpecDecoding: Mean acceptance length: {spec.mean_acceptance_length:.2f}, "
            f"Accepted: {spec.num_accepted_tokens} tokens, Drafted: {spec.num_draft_tokens} tokens, "
            f"Draft acceptance rate: {rate:.1%}, Per-position acceptance rate: {per_pos}"
        )
