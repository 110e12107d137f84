"""The HF transformers baseline on CPU (tiny config), the plots and `vjx bench` dispatch."""

import importlib.util
import json
import types

import pytest

from benchmarks import cli, plot
from benchmarks.baselines import hf_transformers


def test_hf_latency_matches_the_vjx_schema(tiny_model_dir, tmp_path):
    path = tmp_path / "hf_latency.json"
    assert (
        hf_transformers.main(
            [
                "latency",
                "--model",
                tiny_model_dir,
                "--dtype",
                "float32",
                "--device",
                "cpu",
                "--batch-size",
                "2",
                "1",
                "--input-len",
                "8",
                "--output-len",
                "5",
                "--num-iters-warmup",
                "1",
                "--num-iters",
                "2",
                "--output-json",
                str(path),
            ]
        )
        == 0
    )
    result = json.loads(path.read_text())
    assert (result["benchmark"], result["engine"], result["device"]) == ("latency", "hf-transformers", "cpu")
    assert result["cache_implementation"] == "dynamic"  # auto: static only on CUDA
    assert [r["batch_size"] for r in result["runs"]] == [2, 1]
    for run in result["runs"]:
        assert len(run["latencies_s"]) == 2 and run["prefill_s"] > 0
        assert run["decode_step_s"] == pytest.approx((run["latency_s"] - run["prefill_s"]) / 4)


def test_hf_throughput_generates_every_token(tiny_model_dir, tmp_path):
    path = tmp_path / "hf_throughput.json"
    assert (
        hf_transformers.main(
            [
                "throughput",
                "--model",
                tiny_model_dir,
                "--dtype",
                "float32",
                "--device",
                "cpu",
                "--num-prompts",
                "5",
                "--batch-size",
                "2",
                "--input-len",
                "8",
                "--output-len",
                "6",
                "--num-iters",
                "2",
                "--output-json",
                str(path),
            ]
        )
        == 0
    )
    result = json.loads(path.read_text())
    assert (result["input_tokens"], result["output_tokens"]) == (40, 30)
    assert result["output_tok_per_s"] == pytest.approx(30 / result["generate_s"])
    assert len(result["runs"]) == 2 and result["generate_s"] == min(r["generate_s"] for r in result["runs"])


def _latency_result(engine: str, sizes: list[int]) -> dict:
    runs = [
        {
            "batch_size": b,
            "input_len": 32,
            "output_len": 128,
            "latency_s": 0.1 * b,
            "p10_s": 0.09 * b,
            "p90_s": 0.11 * b,
            "decode_step_s": 0.001 * b,
        }
        for b in sizes
    ]
    return {"benchmark": "latency", "engine": engine, "runs": runs}


def _throughput_result(engine: str, dataset: str) -> dict:
    return {
        "benchmark": "throughput",
        "engine": engine,
        "dataset": dataset,
        "num_prompts": 10,
        "input_len": 512,
        "output_len": 512,
        "mean_input_len": 220.0,
        "mean_output_len": 190.0,
        "output_tok_per_s": 1e4,
    }


def test_plot_reads_results_and_draws_or_says_why_not(tmp_path, capsys):
    results = [
        _latency_result("vjx", [8, 1]),
        _latency_result("hf-transformers", [1]),
        _throughput_result("vjx", "random"),
        _throughput_result("vjx", "sharegpt-synthetic"),
    ]
    for i, result in enumerate(results):
        (tmp_path / f"{i}.json").write_text(json.dumps(result))
    (tmp_path / "other.json").write_text(json.dumps({"benchmark": "sampler"}))
    assert plot.load_results([str(tmp_path)]) == results
    series = plot.latency_series(results)
    assert [r["batch_size"] for r in series["vjx (32 in, 128 out)"]] == [1, 8]
    assert plot.main([str(tmp_path), "--output-dir", str(tmp_path / "png")]) == 0
    out = capsys.readouterr().out
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib is not installed" in out
    else:
        for name in ("latency.png", "throughput.png"):
            assert (tmp_path / "png" / name).read_bytes()[:4] == b"\x89PNG"


def test_cli_dispatches_to_the_module_main(monkeypatch):
    seen = []
    fake = types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0)
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: seen.append(name) or fake)
    assert cli.main(["serve", "--request-rate", "4"]) == 0
    assert seen == ["benchmarks.serve", ["--request-rate", "4"]]


def test_cli_rejects_an_unknown_benchmark(capsys):
    assert cli.main(["nope"]) == 2
    assert "benchmark must be one of latency, throughput, serve" in capsys.readouterr().err
    assert cli.main(["roofline", "--batch-size", "1"]) == 0
