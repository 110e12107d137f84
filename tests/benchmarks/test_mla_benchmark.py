"""The MLA forms benchmark: shapes from the DeepSeek config, and a CPU run end to end."""

import json
import pathlib

import pytest

from benchmarks import mla

CONFIGS = pathlib.Path(__file__).parents[2] / "benchmarks/configs"


def test_shape_of_deepseek_v2_lite():
    config = json.loads((CONFIGS / "deepseek-v2-lite" / "config.json").read_text())
    expected = {"num_heads": 16, "kv_lora_rank": 512, "nope_dim": 128, "rope_dim": 64, "value_dim": 128}
    assert mla.mla_shape(config) == expected


def test_cpu_run_writes_every_case(tmp_path):
    config = {"num_attention_heads": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 8}
    (tmp_path / "config.json").write_text(json.dumps({**config, "qk_rope_head_dim": 4, "v_head_dim": 8}))
    path = tmp_path / "mla.json"
    argv = ["--model", str(tmp_path), "--prefill-lens", "20", "--decode-batches", "3", "--context-len", "17"]
    assert mla.main([*argv, "--dtype", "float32", "--repeats", "1", "--output-json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "mla" and result["kv_lora_rank"] == 16
    cases = [(run["case"], run["num_rows"], run["query_len"], run["context_len"]) for run in result["runs"]]
    assert cases == [("prefill", 1, 20, 0), ("decode", 3, 1, 17)]
    assert all(run[k] > 0 for run in result["runs"] for k in ("absorbed_ms", "expanded_ms"))


def test_rejects_an_empty_case(tmp_path):
    with pytest.raises(ValueError, match="must all be >= 1"):
        mla.main(["--model", str(tmp_path), "--prefill-lens", "0"])
