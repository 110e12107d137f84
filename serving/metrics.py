"""ServerMetrics: the server's Prometheus metrics, with vLLM's names under `vjx:`.

Two feeds: AsyncLLM tells it of every engine request's adds, outputs and aborts (it is a
`RequestStatsListener`), which gives TTFT, time per output token, end-to-end latency and
the token counters; `update_from_engine()` asks the engine for `SchedulerStats` (gauges now,
counts since the last ask) before each scrape and each stats log line. Every metric lives
in the server's own registry, so several servers can share a process.
"""

import asyncio
import dataclasses
import logging

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vjx.core.sched.stats import SchedulerStats
from vjx.engine.async_llm import AsyncLLM
from vjx.engine.messages import EngineCoreOutput, EngineCoreRequest

logger = logging.getLogger(__name__)

PREFIX = "vjx:"
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_STATS_TIMEOUT_S = 5.0


@dataclasses.dataclass
class _RequestTimes:
    arrival_time: float
    num_prompt_tokens: int
    last_token_time: float | None = None


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self._requests: dict[str, _RequestTimes] = {}
        self.totals: SchedulerStats | None = None
        """Scheduler gauges now and counts since start, for the stats log."""
        self._make_scheduler_metrics()
        self._make_request_metrics()

    def _labels(self, metric):
        return metric.labels(model_name=self.model_name)

    def _make_scheduler_metrics(self) -> None:
        def make(kind, name: str, documentation: str):
            return self._labels(kind(PREFIX + name, documentation, ["model_name"], registry=self.registry))

        self.num_requests_running = make(Gauge, "num_requests_running", "Requests in the running queue.")
        self.num_requests_waiting = make(Gauge, "num_requests_waiting", "Requests waiting to run (preempted too).")
        self.kv_cache_usage = make(Gauge, "kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = all).")
        self.prefix_cache_queries = make(
            Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = make(Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.num_preemptions = make(Counter, "num_preemptions", "Requests preempted (recomputed later).")

    def _make_request_metrics(self) -> None:
        def make(kind, name: str, documentation: str, **kwargs):
            return self._labels(kind(PREFIX + name, documentation, ["model_name"], registry=self.registry, **kwargs))

        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens of requests that started generating.")
        self.generation_tokens = make(Counter, "generation_tokens", "Generated tokens.")
        self.time_to_first_token = make(
            Histogram,
            "time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            buckets=_TTFT_BUCKETS,
        )
        self.time_per_output_token = make(
            Histogram,
            "time_per_output_token_seconds",
            "Time between a request's outputs, per token.",
            buckets=_TPOT_BUCKETS,
        )
        self.e2e_request_latency = make(
            Histogram,
            "e2e_request_latency_seconds",
            "Time from arrival to the last token of finished requests.",
            buckets=_E2E_BUCKETS,
        )
        self.request_success = Counter(
            PREFIX + "request_success",
            "Finished requests, by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )

    def on_requests_added(self, requests: list[EngineCoreRequest]) -> None:
        for request in requests:
            self._requests[request.request_id] = _RequestTimes(request.arrival_time, len(request.prompt_token_ids))

    def on_outputs(self, outputs: list[EngineCoreOutput], stopped_ids: list[str], now: float) -> None:
        stopped = set(stopped_ids)
        for output in outputs:
            times = self._requests.get(output.request_id)
            if times is None:
                continue
            num_new = len(output.new_token_ids)
            if num_new:
                if times.last_token_time is None:
                    self.time_to_first_token.observe(max(0.0, now - times.arrival_time))
                    self.prompt_tokens.inc(times.num_prompt_tokens)
                else:
                    self.time_per_output_token.observe((now - times.last_token_time) / num_new)
                times.last_token_time = now
                self.generation_tokens.inc(num_new)
            if output.finished or output.request_id in stopped:
                del self._requests[output.request_id]
                self.e2e_request_latency.observe(max(0.0, now - times.arrival_time))
                reason = "stop" if output.request_id in stopped else str(output.finish_reason)
                self.request_success.labels(model_name=self.model_name, finished_reason=reason).inc()

    def on_requests_aborted(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._requests.pop(request_id, None)

    def record_scheduler_stats(self, stats: SchedulerStats) -> None:
        """Sets the gauges and adds the counts (`stats` holds those since the last ask)."""
        self.num_requests_running.set(stats.num_running_reqs)
        self.num_requests_waiting.set(stats.num_waiting_reqs)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        self.prefix_cache_queries.inc(stats.num_prefix_queried_tokens)
        self.prefix_cache_hits.inc(stats.num_prefix_hit_tokens)
        self.num_preemptions.inc(stats.num_preemptions)
        totals = self.totals
        self.totals = (
            stats
            if totals is None
            else dataclasses.replace(
                stats,
                num_steps=totals.num_steps + stats.num_steps,
                num_scheduled_tokens=totals.num_scheduled_tokens + stats.num_scheduled_tokens,
                num_preemptions=totals.num_preemptions + stats.num_preemptions,
                num_prefix_queried_tokens=totals.num_prefix_queried_tokens + stats.num_prefix_queried_tokens,
                num_prefix_hit_tokens=totals.num_prefix_hit_tokens + stats.num_prefix_hit_tokens,
            )
        )

    async def update_from_engine(self, engine: AsyncLLM) -> None:
        """Reads the engine's SchedulerStats; a dead or stuck engine leaves the metrics as they were."""
        if engine.errored:
            return
        try:
            stats = await asyncio.wait_for(engine.get_stats(), _STATS_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - metrics must not fail because the engine did
            logger.warning("Could not read the engine's stats: %r", e)
            return
        self.record_scheduler_stats(stats)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)

    async def log_stats_forever(self, engine: AsyncLLM, interval_s: float) -> None:
        """Logs vLLM's periodic stats line (counts over the interval) while requests run."""
        previous = None
        while True:
            await asyncio.sleep(interval_s)
            await self.update_from_engine(engine)
            totals = self.totals
            if totals is None or (previous is not None and totals == previous and not totals.num_running_reqs):
                continue
            logger.info("%s", totals if previous is None else totals.since(previous))
            previous = totals
