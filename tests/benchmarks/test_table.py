"""benchmarks.table: latency and throughput results as one markdown table, median (min, max)."""

import json

import pytest

from benchmarks import table

_META = {
    "engine": "vjx",
    "model": "benchmarks/configs/llama-3.1-8b",
    "device": "NVIDIA H100 80GB HBM3",
    "date": "2026-12-07",
    "git_sha": "abc1234",
    "versions": {"jax": "0.11.2"},
    "gpu_clocks": [{"clocks.sm": "1980", "clocks.mem": "2619"}],
}


def _latency() -> dict:
    run = {"batch_size": 8, "input_len": 32, "output_len": 128, "temperature": 0.0, "latency_s": 0.75}
    run.update(p50_s=0.749, latencies_s=[0.751, 0.749, 0.748], decode_step_s=0.00578, decode_hbm_fraction=0.78)
    return {**_META, "benchmark": "latency", "engine_args": {"quantization": "fp8"}, "runs": [run]}


def _throughput() -> dict:
    lengths = {"dataset": "random", "num_prompts": 1000, "input_len": 512, "output_len": 512}
    rates = {"output_tok_per_s": 11155.1, "output_tok_per_s_min": 11086.7, "output_tok_per_s_max": 11159.2}
    args = {"max_num_seqs": "1024", "max_num_batched_tokens": "16384"}
    return {**_META, "benchmark": "throughput", "engine_args": args, **lengths, **rates}


def test_rows_give_the_median_and_the_range(tmp_path, capsys):
    throughput = {**_throughput(), "requests_per_s": 21.79, "total_tok_per_s": 22310.2}
    for name, result in [("a.json", _latency()), ("b.json", throughput), ("c.json", {"benchmark": "sampler"})]:
        (tmp_path / name).write_text(json.dumps(result))
    assert table.main([str(tmp_path), "--output", str(tmp_path / "table.md")]) == 0
    text = capsys.readouterr().out
    assert text == (tmp_path / "table.md").read_text()
    assert "| vjx | llama-3.1-8b | fp8 | 32 / 128 | 8 | 0 | 0.749 | 0.748 | 0.751 | 5.78 | 78.0% |" in text
    config = "max_num_seqs 1024, budget 16384"
    assert f"| vjx | llama-3.1-8b | {config} | 1000 x (512 in, 512 out) | 11,155 | 11,087 | 11,159 |" in text
    assert "commit abc1234, JAX 0.11.2, SM 1980 / memory 2619 MHz" in text


def test_no_results_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no latency or throughput results"):
        table.main([str(tmp_path)])
