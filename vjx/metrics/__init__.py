"""vLLM's Prometheus metrics, shared by the server (`/metrics`) and the offline `LLM.get_metrics()`.

`stats` turns the engine's outputs into per-iteration and per-request figures (the front end's
half, as vLLM's `IterationStats`); `loggers.PrometheusStatLogger` records them under vLLM's
names, types, labels and buckets; `reader` reads a registry back as vLLM's `Metric` objects.
"""
