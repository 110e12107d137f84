"""Live model bandwidth and FLOP utilization (MBU, MFU) of the engine's steps.

Each step's bytes and FLOPs come from the roofline model (vjx/metrics/roofline.py) of what it
ran: per request, the tokens it computed and its keys after the step. A step's time runs from
its dispatch, or from the end of the step before it when that ended later (steps in flight
overlap), to the moment its results are back. Over a stats window, MBU is the bytes moved per
second of step time over the device's peak memory bandwidth, MFU the FLOPs per second over its
peak dense throughput. The peaks come from the table of known devices, or the engine
arguments `peak_memory_bandwidth` and `peak_flops`; without either, no figure is reported.
The model counts a dense decoder: an MoE model counts every expert's weights.
"""

import collections
import dataclasses
import logging
import time

from vjx.core.sched.output import SchedulerOutput
from vjx.metrics.roofline import DEVICE_PEAKS, DevicePeak, ModelShape, step_bytes, step_flops

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Utilization:
    """One window's figures (None: no peak known for that figure)."""

    mbu: float | None = None
    mfu: float | None = None


def device_peak(device_kind: str, bandwidth: float | None, flops: float | None) -> DevicePeak | None:
    """The known peaks of `device_kind`, each overridden when given; None when neither is known."""
    known = DEVICE_PEAKS.get(device_kind)
    bandwidth = bandwidth if bandwidth is not None else (known.hbm_bytes_per_s if known else None)
    flops = flops if flops is not None else (known.dense_bf16_flops_per_s if known else None)
    if bandwidth is None and flops is None:
        return None
    return DevicePeak(hbm_bytes_per_s=bandwidth, dense_bf16_flops_per_s=flops)


class UtilizationMeter:
    """Step costs and times since the last `take()`."""

    def __init__(self, shape: ModelShape, peak: DevicePeak):
        self.shape = shape
        self.peak = peak
        self._in_flight: collections.deque[tuple[SchedulerOutput, float]] = collections.deque()
        self._last_end = 0.0
        self._bytes = self._flops = 0
        self._seconds = 0.0
        self._taken = (0, 0, 0.0)
        """Bytes, FLOPs and step seconds of the windows already taken (for `lifetime`)."""

    @classmethod
    def from_config(cls, hf_config, dtype: str, peak: DevicePeak | None) -> "UtilizationMeter | None":
        """None without a peak, or for a model the roofline cannot count (logged once)."""
        if peak is None:
            return None
        try:
            shape = ModelShape.from_hf_config(hf_config.to_dict(), dtype)
        except (KeyError, ValueError) as e:
            logger.info("MBU and MFU are not reported for this model: %s", e)
            return None
        return cls(shape, peak)

    def dispatched(self, scheduler_output: SchedulerOutput) -> None:
        self._in_flight.append((scheduler_output, time.perf_counter()))

    def collected(self) -> None:
        """The oldest step in flight is done: its bytes, FLOPs and time join the window."""
        scheduler_output, start = self._in_flight.popleft()
        end = time.perf_counter()
        requests = _requests(scheduler_output)
        if requests:
            self._bytes += step_bytes(self.shape, requests)
            self._flops += step_flops(self.shape, requests)
            self._seconds += end - max(start, self._last_end)
        self._last_end = end

    def take(self) -> Utilization:
        """The window's MBU and MFU; the next window starts now."""
        utilization = self._figures(self._bytes, self._flops, self._seconds)
        self._taken = (self._taken[0] + self._bytes, self._taken[1] + self._flops, self._taken[2] + self._seconds)
        self._bytes = self._flops = 0
        self._seconds = 0.0
        return utilization

    def lifetime(self) -> Utilization:
        """MBU and MFU over every step since start."""
        num_bytes, flops, seconds = self._taken
        return self._figures(num_bytes + self._bytes, flops + self._flops, seconds + self._seconds)

    def _figures(self, num_bytes: int | float, flops: int | float, seconds: float) -> Utilization:
        seconds = seconds or float("inf")  # no step ran: 0
        bandwidth, peak_flops = self.peak.hbm_bytes_per_s, self.peak.dense_bf16_flops_per_s
        return Utilization(
            None if bandwidth is None else num_bytes / seconds / bandwidth,
            None if peak_flops is None else flops / seconds / peak_flops,
        )


def _requests(so: SchedulerOutput) -> list[tuple[int, int]]:
    """(tokens computed, keys after the step) of each request the step ran."""
    scheduled, cached = so.num_scheduled_tokens, so.scheduled_cached_reqs
    computed = [(new.req_id, new.num_computed_tokens) for new in so.scheduled_new_reqs]
    computed += zip(cached.req_ids, cached.num_computed_tokens)
    return [(scheduled[req_id], num_computed + scheduled[req_id]) for req_id, num_computed in computed]
