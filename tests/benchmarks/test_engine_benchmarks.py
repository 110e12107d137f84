"""Smoke tests: vjx's latency and throughput benchmarks run end to end on a tiny random
Llama (CPU) and write complete JSON."""

import json
import sys

import jax
import numpy as np
import pytest

from benchmarks import latency, structured, throughput
from tests.helpers.benchmark_model import ENGINE_FLAGS

METADATA = {"benchmark", "engine", "date", "platform", "device", "command", "argv", "model"}


def test_latency_writes_one_row_per_batch_size(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "latency.json"
    argv = [
        "--model",
        tiny_model_dir,
        *ENGINE_FLAGS,
        "--batch-size",
        "4",
        "1",
        "--temperature",
        "0",
        "1",
        "--input-len",
        "8",
        "--output-len",
        "6",
        "--num-iters-warmup",
        "1",
        "--num-iters",
        "3",
        "--output-json",
        str(path),
    ]
    assert latency.main(argv) == 0
    result = json.loads(path.read_text())
    assert METADATA <= result.keys()
    assert (result["benchmark"], result["engine"], result["platform"]) == ("latency", "vjx", "cpu")
    assert result["argv"] == sys.argv  # the command line that started this process
    assert result["load_s"] > 0 and result["warmup_s"] > 0 and result["engine_ready_s"] > 0
    assert len(result["git_sha"].split("+")[0]) == 40  # this checkout's commit
    assert result["versions"]["jax"] == jax.__version__ and result["gpu_clocks"] is None
    assert result["engine_args"]["model"] == tiny_model_dir and "dtype" not in result["engine_args"]
    assert [(r["batch_size"], r["temperature"]) for r in result["runs"]] == [(4, 0), (1, 0), (4, 1), (1, 1)]
    for run in result["runs"]:
        assert (run["input_len"], run["output_len"]) == (8, 6)
        assert len(run["latencies_s"]) == 3
        assert run["latency_s"] == pytest.approx(np.mean(run["latencies_s"]))
        assert run["p10_s"] <= run["p50_s"] <= run["p90_s"] <= run["p99_s"]
        assert run["decode_step_s"] == pytest.approx((run["latency_s"] - run["prefill_s"]) / 5)
        assert run["decode_step_bytes"] > 0 and run["prefill_flops"] > 0
        assert run["decode_hbm_fraction"] is None  # no published peaks for a CPU
    table = capsys.readouterr().out
    assert table.count("\n| 4 | 8 | 6 |") == 2 and table.count("\n| 1 | 8 | 6 |") == 2
    assert table.count(" | 0 |\n") == 2 and table.count(" | 1 |\n") == 2


@pytest.mark.parametrize("dataset", ["random", "sharegpt-synthetic"])
def test_throughput_counts_every_token(tiny_model_dir, tmp_path, dataset):
    path = tmp_path / "throughput.json"
    argv = [
        "--model",
        tiny_model_dir,
        *ENGINE_FLAGS,
        "--num-prompts",
        "6",
        "--input-len",
        "10",
        "--output-len",
        "5",
        "--dataset",
        dataset,
        "--num-iters",
        "3",
        "--output-json",
        str(path),
    ]
    assert throughput.main(argv) == 0
    result = json.loads(path.read_text())
    assert METADATA <= result.keys()
    assert (result["benchmark"], result["dataset"]) == ("throughput", dataset)
    lengths = throughput.request_lengths(throughput_args(dataset), max_model_len=128)
    assert result["input_tokens"] == sum(i for i, _ in lengths)
    assert result["output_tokens"] == sum(o for _, o in lengths)
    elapsed = result["generate_s"]
    assert sorted(r["generate_s"] for r in result["runs"])[1] == elapsed  # the median of three runs
    rates = [r["output_tok_per_s"] for r in result["runs"]]
    assert (result["output_tok_per_s_min"], result["output_tok_per_s_max"]) == (min(rates), max(rates))
    assert result["requests_per_s"] == pytest.approx(6 / elapsed)
    assert result["output_tok_per_s"] == pytest.approx(result["output_tokens"] / elapsed)
    assert result["total_tok_per_s"] == pytest.approx((result["input_tokens"] + result["output_tokens"]) / elapsed)
    assert result["model_flops"] > 0 and result["tensor_core_fraction"] is None
    assert result["load_s"] > 0 and result["warmup_s"] > 0


def throughput_args(dataset: str):
    return throughput.argparse.Namespace(dataset=dataset, num_prompts=6, input_len=10, output_len=5, seed=0)


def test_sharegpt_synthetic_lengths_are_seeded_and_bounded():
    first = throughput.sharegpt_synthetic_lengths(2000, seed=7, max_model_len=2048)
    assert first == throughput.sharegpt_synthetic_lengths(2000, seed=7, max_model_len=2048)
    assert first != throughput.sharegpt_synthetic_lengths(2000, seed=8, max_model_len=2048)
    inputs, outputs = np.array(first).T
    assert inputs.min() >= 4 and inputs.max() <= 1024
    assert outputs.min() >= 4 and (inputs + outputs).max() <= 2048
    # Means near ShareGPT's (220 in, 200 out), a little lower after clipping the tails.
    assert 190 < inputs.mean() < 230 and 170 < outputs.mean() < 215
    short = throughput.sharegpt_synthetic_lengths(500, seed=0, max_model_len=64)
    assert max(i + o for i, o in short) <= 64


def test_bad_lengths_are_value_errors():
    with pytest.raises(ValueError, match="max_model_len must be >= 8"):
        throughput.sharegpt_synthetic_lengths(4, seed=0, max_model_len=6)
    with pytest.raises(ValueError, match="input_len \\+ output_len must be <= max_model_len"):
        throughput.request_lengths(
            throughput.argparse.Namespace(dataset="random", num_prompts=2, input_len=100, output_len=50, seed=0),
            max_model_len=128,
        )
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        latency.parse_args(["--batch-size", "8", "0"])


def test_structured_overhead_runs_both_configurations(tiny_model_dir, tmp_path):
    path = tmp_path / "structured.json"
    argv = ["--model", tiny_model_dir, *ENGINE_FLAGS, "--batch-sizes", "2", "--input-len", "8", "--output-len", "6"]
    assert structured.main([*argv, "--repeats", "3", "--output-json", str(path)]) == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert row["batch_size"] == 2 and len(row["free_runs"]) == len(row["json_schema_runs"]) == 3
    assert row["free_output_tokens_per_s"] == sorted(row["free_runs"])[1]
    ratio = row["json_schema_output_tokens_per_s"] / row["free_output_tokens_per_s"]
    assert row["overhead"] == pytest.approx(1 - ratio)
