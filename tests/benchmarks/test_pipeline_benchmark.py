"""The pipeline-bubble benchmark end to end on two CPU devices, at toy sizes."""

import json
import pathlib

from benchmarks import pipeline

CONFIGS = pathlib.Path(__file__).parents[2] / "benchmarks/configs"


def test_cpu_run_times_both_layouts(tmp_path):
    path = tmp_path / "bubble.json"
    argv = ["--model", str(CONFIGS / "llama-3.1-8b"), "--hidden-size", "64", "--vocab-size", "512"]
    argv += ["--num-layers", "1", "--num-prompts", "2", "--input-len", "8", "--output-len", "4"]
    argv += ["--max-num-batched-tokens", "16"]
    assert pipeline.main([*argv, "--output-json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "pipeline_bubble"
    assert [(run["pipeline_parallel_size"], run["num_layers"]) for run in result["runs"]] == [(1, 1), (2, 2)]
    assert all(run["batch_s"] > 0 and run["one_request_s"] > 0 for run in result["runs"])
    assert result["bubble"] == 1 - result["runs"][0]["batch_s"] / result["runs"][1]["batch_s"]
