"""ServerMetrics: the server's Prometheus metrics, vLLM's (vjx.metrics) under `vjx:` or `vllm:`.

Two feeds: AsyncLLM gives it the `IterationStats` of every batch of engine outputs (it is a
`RequestStatsListener`), which gives the token counters and the latency histograms;
`update_from_engine()` asks the engine for `SchedulerStats` (gauges now, counts since the last
ask) before each scrape and each stats log line. Every metric lives in the server's own
registry, so several servers can share a process.
"""

import asyncio
import dataclasses
import logging

import prometheus_client

from vjx.core.sched.stats import SchedulerStats
from vjx.engine.async_llm import AsyncLLM
from vjx.metrics.loggers import PrometheusStatLogger
from vjx.metrics.stats import IterationStats

logger = logging.getLogger(__name__)

_STATS_TIMEOUT_S = 5.0


class ServerMetrics:
    def __init__(self, engine: AsyncLLM, model_name: str, prefix: str = "vjx"):
        """`prefix`: "vjx" or "vllm" (`--metrics-prefix`), the start of every metric's name."""
        config = engine.config
        self.stat_logger = PrometheusStatLogger(
            model_name, config.model_config.max_model_len, prefix, num_speculative_tokens=config.num_speculative_tokens
        )
        self.stat_logger.log_cache_config(config.cache_config, engine.engine_core.ready.num_gpu_blocks)
        self.registry = self.stat_logger.registry
        self.totals: SchedulerStats | None = None
        """Scheduler gauges now and counts since start, for the stats log."""

    def record_iteration_stats(self, iteration_stats: IterationStats) -> None:
        self.stat_logger.record_iteration_stats(iteration_stats)

    def record_admission_rejection(self, reason: str) -> None:
        self.stat_logger.record_admission_rejection(reason)

    def record_scheduler_stats(self, stats: SchedulerStats) -> None:
        """Sets the gauges and adds the counts (`stats` holds those since the last ask)."""
        self.stat_logger.record_scheduler_stats(stats)
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
                spec_decoding_stats=totals.spec_decoding_stats + stats.spec_decoding_stats,
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
