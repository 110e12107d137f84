"""vLLM's metrics reader: a registry's metrics as plain `Metric` objects (`LLM.get_metrics()`).

One object per labelled series: a `Counter` (integer value), a `Gauge`, or a `Histogram`
(`buckets` maps each bucket's upper bound as text, "+Inf" included, to its cumulative count).
`Vector` is vLLM's type for per-position counters (speculative decoding), which vjx has none of.
"""

import dataclasses

from prometheus_client import CollectorRegistry


@dataclasses.dataclass
class Metric:
    name: str
    labels: dict[str, str]


@dataclasses.dataclass
class Counter(Metric):
    value: int


@dataclasses.dataclass
class Vector(Metric):
    values: list[int]


@dataclasses.dataclass
class Gauge(Metric):
    value: float


@dataclasses.dataclass
class Histogram(Metric):
    count: int
    sum: float
    buckets: dict[str, int]


def get_metrics_snapshot(registry: CollectorRegistry, prefix: str) -> list[Metric]:
    """Every metric of `registry` whose name starts with `prefix` (e.g. "vjx:")."""
    collected: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith(prefix):
            continue
        if family.type == "gauge":
            collected += [Gauge(family.name, s.labels, s.value) for s in family.samples]
        elif family.type == "counter":
            name = family.name + "_total"
            collected += [Counter(family.name, s.labels, int(s.value)) for s in family.samples if s.name == name]
        elif family.type == "histogram":
            collected += _histograms(family)
        else:
            raise ValueError(f"metric {family.name!r} has type {family.type!r}; only gauges, counters and histograms.")
    return collected


def _histograms(family) -> list[Histogram]:
    """One `Histogram` per label set, from the family's _bucket, _count and _sum samples."""
    by_labels: dict[frozenset, Histogram] = {}
    for sample in family.samples:
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        key = frozenset(labels.items())
        histogram = by_labels.setdefault(key, Histogram(family.name, labels, 0, 0.0, {}))
        suffix = sample.name[len(family.name) :]
        if suffix == "_bucket":
            histogram.buckets[sample.labels["le"]] = int(sample.value)
        elif suffix == "_count":
            histogram.count = int(sample.value)
        elif suffix == "_sum":
            histogram.sum = sample.value
    return list(by_labels.values())
