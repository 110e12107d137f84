"""The step profile: a CPU run end to end (XLA:CPU's top-level ops stand for the kernels), and
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
        assert run["busy_ms_per_step"] > 0 and run["group_ms_per_step"]["gemm"] > 0
        assert run["busy_ms_per_step"] == pytest.approx(sum(run["group_ms_per_step"].values()))
        assert run["top_kernels"] and all(k["calls_per_step"] > 0 for k in run["top_kernels"])


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


def _op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "pid": 7, "tid": tid, "ts": ts, "dur": dur, "name": name, "args": {"hlo_op": name}}


def test_cpu_ops_count_once_with_a_loop_holding_its_body():
    events = [
        _op("while.3", 0.0, 50.0),
        _op("ynn_fusion.4", 5.0, 10.0),  # inside the loop
        _op("cond.5", 20.0, 20.0),
        _op("copy.6", 25.0, 5.0),  # inside the loop's cond
        _op("ynn_fusion.7", 60.0, 30.0),
        _op("ynn_fusion.8", 0.0, 40.0, tid=2),  # another thread
        {"ph": "X", "pid": 7, "tid": 1, "ts": 0.0, "dur": 100.0, "name": "ThunkExecutor::Execute", "args": {}},
    ]
    top = step_profile.cpu_top_level_ops(events)
    assert sorted(e["name"] for e in top) == ["while.3", "ynn_fusion.7", "ynn_fusion.8"]
    kernels = {e["name"]: [e["dur"], 1] for e in top}
    run = step_profile.summarize(1, 1, 0.001, kernels, step_profile.CPU_GROUPS)
    assert run["group_ms_per_step"] == pytest.approx({"gemm": 0.07, "attention": 0.05, "kv_write": 0.0, "other": 0.0})
