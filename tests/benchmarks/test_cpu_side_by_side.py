"""The CPU side by side's table from its records (the engines' runs need vLLM's own venv:
`python -m benchmarks.cpu_side_by_side` runs them; here only the summary and the table)."""

from benchmarks import cpu_side_by_side


def _runs(engine: str, rates: list[float]) -> list[dict]:
    return [
        {"engine": engine, "dtype": "float32", "row": "latency-1", "repeat": i, "output_tok_s": r}
        for i, r in enumerate(rates)
    ]


def test_the_table_gives_median_min_max_and_the_ratio_to_vllm():
    runs = _runs("vjx", [20.0, 24.0, 22.0]) + _runs("vllm", [11.0, 10.0, 12.0])
    startup = [
        {"engine": "vjx", "run": "cold", "ready_s": 50.0},
        {"engine": "vjx", "run": "warm", "ready_s": 9.0},
    ]
    result = {
        "dtypes": ["float32"],
        "summary": cpu_side_by_side.summarize(runs, "output_tok_s", ("dtype", "row", "engine")),
        "startup_summary": cpu_side_by_side.summarize(startup, "ready_s", ("engine", "run")),
    }
    assert result["summary"][0] == {
        "dtype": "float32",
        "row": "latency-1",
        "engine": "vjx",
        "median": 22.0,
        "min": 20.0,
        "max": 24.0,
        "runs": 3,
    }
    table = cpu_side_by_side.markdown(result, ["vjx", "vllm"])
    assert "| float32 | latency-1 | 22.0 (20.0-24.0) | 11.0 (10.0-12.0) | 2.00x |" in table
    assert "| float32 | throughput-64 | - | - | - |" in table
    assert "| vjx | 50.0 (50.0-50.0) | 9.0 (9.0-9.0) |" in table
    assert "| vllm | - | - |" in table
