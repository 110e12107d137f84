"""MBU and MFU from the roofline model: a meter fed steps at known times gives the bytes and
FLOPs of what each step ran over the step time, against the peaks; overlapping steps count
their time once; known devices have peaks, others only the ones given; replicas average."""

import pytest

from vjx.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.core_client import merge_stats
from vjx.metrics import utilization
from vjx.metrics.roofline import DevicePeak, ModelShape, step_bytes, step_flops
from vjx.metrics.utilization import UtilizationMeter, device_peak
from vjx.sampling_params import SamplingParams

SHAPE = ModelShape(4, 64, 4, 2, 16, 128, 300, False, 4)
PEAK = DevicePeak(hbm_bytes_per_s=1e9, dense_bf16_flops_per_s=1e11)


def _step(new: tuple[str, int, int], cached: list[tuple[str, int, int]]) -> SchedulerOutput:
    """A step with one new request and some running ones: (id, computed tokens, scheduled)."""
    req_id, computed, scheduled = new
    new_req = NewRequestData(req_id, [1] * (computed + scheduled), SamplingParams(), ([1],), computed)
    cached_reqs = CachedRequestData(
        [r for r, _, _ in cached], [False] * len(cached), [None] * len(cached), [c for _, c, _ in cached]
    )
    num_scheduled = {req_id: scheduled, **{r: n for r, _, n in cached}}
    return SchedulerOutput([new_req], cached_reqs, num_scheduled, sum(num_scheduled.values()), set())


def test_meter_divides_the_roofline_cost_by_step_time(monkeypatch):
    clock = iter([0.0, 0.5, 0.6, 1.0, 1.5])
    monkeypatch.setattr(utilization.time, "perf_counter", lambda: next(clock))
    meter = UtilizationMeter(SHAPE, PEAK)
    first, second = _step(("a", 0, 20), []), _step(("b", 4, 8), [("a", 20, 1)])
    meter.dispatched(first)  # t=0
    meter.dispatched(second)  # t=0.5, while the first runs
    meter.collected()  # t=0.6: the first took 0.6 s
    meter.collected()  # t=1.0: the second ran from 0.6
    figures = meter.take()
    requests = [[(20, 20)], [(8, 12), (1, 21)]]
    seconds = 0.6 + 0.4
    assert figures.mbu == pytest.approx(sum(step_bytes(SHAPE, r) for r in requests) / seconds / 1e9)
    assert figures.mfu == pytest.approx(sum(step_flops(SHAPE, r) for r in requests) / seconds / 1e11)
    assert meter.take() == utilization.Utilization(0.0, 0.0)
    assert meter.lifetime() == figures, "the host profile's figures span every step"


def test_peaks_come_from_the_table_or_the_arguments():
    assert device_peak("NVIDIA H200", None, None) == DevicePeak(4.8e12, 989e12)
    assert device_peak("NVIDIA H200", 1.0, None) == DevicePeak(1.0, 989e12)
    assert device_peak("cpu", None, None) is None
    assert device_peak("cpu", None, 5.0) == DevicePeak(None, 5.0)


def test_replicas_average_their_utilization():
    stats = [SchedulerStats(1, 0, 0.5, mbu=0.2, mfu=None), SchedulerStats(1, 0, 0.5, mbu=0.4, mfu=None)]
    merged = merge_stats(stats)
    assert merged.mbu == pytest.approx(0.3) and merged.mfu is None
    assert "MBU: 30.0%" in str(merged) and "MFU" not in str(merged)
