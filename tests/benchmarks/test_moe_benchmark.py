"""The MoE experts benchmark: shapes from the MoE configs, and a CPU run end to end."""

import json
import pathlib

import pytest

from benchmarks import moe

CONFIGS = pathlib.Path(__file__).parents[2] / "benchmarks/configs"


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("qwen3-30b-a3b", {"hidden": 2048, "width": 768, "num_experts": 128, "top_k": 8}),
        ("mixtral-8x7b", {"hidden": 4096, "width": 14336, "num_experts": 8, "top_k": 2}),
        ("gpt-oss-20b", {"hidden": 2880, "width": 2880, "num_experts": 32, "top_k": 4}),
    ],
)
def test_shapes_of_the_moe_configs(name, shape):
    config = json.loads((CONFIGS / name / "config.json").read_text())
    assert moe.moe_shape(config, None) == shape


def test_cpu_run_writes_every_token_count(tmp_path):
    config = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 2}))
    path = tmp_path / "moe.json"
    argv = ["--model", str(tmp_path), "--num-tokens", "1", "8", "--num-experts", "4", "--dtype", "float32"]
    assert moe.main([*argv, "--repeats", "1", "--output-json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "moe" and (result["num_experts"], result["width"]) == (4, 32)
    assert [(run["num_tokens"], run["path"]) for run in result["runs"]] == [(1, "gathered"), (8, "grouped")]
    assert all(run[k] > 0 for run in result["runs"] for k in ("fused_us", "loop_us", "active_dense_us"))


def test_a_dense_config_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "intermediate_size": 128}))
    with pytest.raises(ValueError, match="not a MoE model"):
        moe.main(["--model", str(tmp_path)])
