"""One request's speculative decoding, for its response (vLLM's `per_request_spec_decode_metrics`).

The scheduler keeps a `RequestSpecDecodeMetrics` per engine request (each child of an `n > 1`
request has its own) and observes it at every step that verifies the request's drafts. It
crosses to the front end once, in the request's finishing `EngineCoreOutput`, and lands on the
final `CompletionOutput`; the server reports it as `metrics.speculative_decoding` when the
request has one sequence. A request finished in the front end (a stop string, an abort)
never receives it, as in vLLM.
"""

import dataclasses
from typing import Any

SPEC_DECODE_METRICS_LEVELS = ("none", "summary", "detailed")
"""`none`: no metrics; `summary`: the counts and the histogram; `detailed`: also the accepted
and drafted counts of every verify step, in order."""


@dataclasses.dataclass
class RequestSpecDecodeMetrics:
    """Counts over one request's verify steps (steps that scheduled at least one draft).

    A verify step that accepts `j` drafts keeps `j + 1` tokens: the accepted drafts and the
    token the model drew after them (the bonus token), which the counts here leave out.
    """

    num_spec_tokens: int
    """The configured `num_speculative_tokens`: the most drafts one step verifies."""
    histogram: list[int] = dataclasses.field(default_factory=list)
    """`histogram[j]`: verify steps that accepted exactly `j` drafts (`num_spec_tokens + 1` entries)."""
    num_draft_tokens: int = 0
    """Drafts verified, over all steps."""
    per_step_accepted: list[int] = dataclasses.field(default_factory=list)
    """Drafts accepted at each verify step, in order ("detailed" only; else empty)."""
    per_step_drafted: list[int] = dataclasses.field(default_factory=list)
    """Drafts verified at each verify step, in order ("detailed" only; else empty)."""

    @classmethod
    def new(cls, num_spec_tokens: int) -> "RequestSpecDecodeMetrics":
        return cls(num_spec_tokens=num_spec_tokens, histogram=[0] * (num_spec_tokens + 1))

    def observe(self, num_draft_tokens: int, num_accepted: int, detailed: bool = False) -> None:
        """One verify step: `num_accepted` of its `num_draft_tokens` drafts were kept."""
        self.histogram[num_accepted] += 1
        self.num_draft_tokens += num_draft_tokens
        if detailed:
            self.per_step_accepted.append(num_accepted)
            self.per_step_drafted.append(num_draft_tokens)

    def to_dict(self) -> dict[str, Any]:
        """The response's `metrics.speculative_decoding`, in vLLM's fields.

        `mean_acceptance_length` counts the bonus token (1.0 without verify steps);
        `draft_acceptance_rate` counts drafts only (0.0 without drafts). The per-step arrays
        are there only when they were recorded ("detailed").
        """
        num_spec_steps = sum(self.histogram)
        num_accepted = sum(j * count for j, count in enumerate(self.histogram))
        metrics: dict[str, Any] = {
            "mean_acceptance_length": 1.0 + num_accepted / num_spec_steps if num_spec_steps else 1.0,
            "draft_acceptance_rate": num_accepted / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            "acceptance_histogram": list(self.histogram),
            "num_spec_steps": num_spec_steps,
            "num_accepted_draft_tokens": num_accepted,
            "num_draft_tokens": self.num_draft_tokens,
            "num_spec_tokens": self.num_spec_tokens,
        }
        if self.per_step_accepted:
            metrics["per_step_accepted"] = list(self.per_step_accepted)
            metrics["per_step_drafted"] = list(self.per_step_drafted)
        return metrics
