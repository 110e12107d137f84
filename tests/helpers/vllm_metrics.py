"""Checks a /metrics scrape (or a registry) against vLLM 0.32.0's table (tests/metrics)."""

from prometheus_client.parser import text_string_to_metric_families

from tests.metrics.vllm_0_32_0_metrics import BUCKETS, ENGINE_LABELS, METRICS, NOT_IN_VJX

VJX_METRICS = {"mbu": ("gauge", ENGINE_LABELS, None), "mfu": ("gauge", ENGINE_LABELS, None)}
"""vjx's own metrics beside vLLM's: model bandwidth and FLOP utilization (vjx/metrics/utilization.py)."""


def families_by_name(text: str, prefix: str) -> dict:
    """The families of a scrape named `prefix:...`, by their name without the prefix; the
    `_created` gauges prometheus_client adds beside each counter and histogram are left out."""
    return {
        f.name[len(prefix) + 1 :]: f
        for f in text_string_to_metric_families(text)
        if f.name.startswith(prefix + ":") and not f.name.endswith("_created")
    }


def check_against_vllm(families: dict) -> None:
    """Every family is vLLM's (or one of vjx's own) with its type, label names and buckets;
    every vLLM metric vjx has a feature for is there."""
    missing = set(METRICS) - set(NOT_IN_VJX) - set(families)
    assert not missing, f"vLLM's metrics missing: {sorted(missing)}"
    table = {**METRICS, **VJX_METRICS}
    for name, family in families.items():
        assert name in table and name not in NOT_IN_VJX, f"{name} is not one of vLLM's metrics"
        kind, labels, bucket_family = table[name]
        assert family.type == kind, (name, family.type)
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        assert samples, name
        for sample in samples:
            names = set(sample.labels) - {"le"}
            if labels is None:
                assert {"engine", "block_size", "num_gpu_blocks"} <= names, (name, names)
            else:
                assert names == set(labels), (name, names)
        if bucket_family is not None:
            bounds = [float(s.labels["le"]) for s in samples if s.name.endswith("_bucket")]
            assert bounds == [float(b) for b in BUCKETS[bucket_family]] + [float("inf")], (name, bounds)
