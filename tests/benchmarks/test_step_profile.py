"""The step profile: a CPU run end to end (wall only: XLA:CPU traces no device kernels), and
the grouping of device kernels into GEMMs, attention, KV write and the rest."""

import json

import pytest

from benchmarks import step_profile
from tests.helpers.benchmark_model import ENGINE_FLAGS


def test_cpu_run_writes_wall_per_batch(tiny_model_dir, tmp_path):
    path = tmp_path / "profile.json"
    argv = [
        "--model",
        tiny_model_dir,
        *ENGINE_FLAGS,
        "--batch-size",
        "2",
        "5",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--num-steps",
        "4",
        "--output-json",
        str(path),
    ]
    assert step_profile.main(argv) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "step_profile" and result["platform"] == "cpu"
    assert [run["batch_size"] for run in result["runs"]] == [2, 5]
    for run in result["runs"]:
        assert run["num_steps"] == 4 and run["wall_ms_per_step"] > 0
        assert run["busy_ms_per_step"] is None and run["top_kernels"] == []


def test_kernels_are_grouped_and_averaged_per_step():
    kernels = {
        "gemm_fusion_dot_33": [560.0, 10],
        "nvjet_sm90_tst_128x128": [300.0, 10],
        "decode_kernel": [80.0, 10],
        "merge_prefill_kernel": [30.0, 10],
        "input_scatter_fusion_1": [20.0, 10],
        "loop_add_fusion_1": [10.0, 20],
    }
    run = step_profile.summarize(batch_size=8, num_steps=10, wall_s=0.001, kernels=kernels)
    assert run["group_ms_per_step"] == pytest.approx(
        {"gemm": 0.086, "attention": 0.011, "kv_write": 0.002, "other": 0.001}
    )
    assert run["busy_ms_per_step"] == pytest.approx(0.1)
    assert run["busy_fraction"] == pytest.approx(1.0)
    assert [k["name"] for k in run["top_kernels"][:2]] == ["gemm_fusion_dot_33", "nvjet_sm90_tst_128x128"]
    assert run["top_kernels"][-1] == {"name": "loop_add_fusion_1", "us_per_step": 1.0, "calls_per_step": 2.0}


def test_output_len_must_cover_the_traced_steps():
    with pytest.raises(ValueError, match="output_len"):
        step_profile.parse_args(["--output-len", "10", "--num-steps", "9"])
