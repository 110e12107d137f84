"""The INT4 GEMM benchmark: a CPU run end to end (the kernel in interpret mode)."""

import json

from benchmarks.kernels import int4_matmul
from tests.helpers.benchmark_model import TINY_CONFIG


def test_cpu_run_writes_every_projection(tiny_model_dir, tmp_path):
    path = tmp_path / "int4_matmul.json"
    argv = ["--model", tiny_model_dir, "--num-tokens", "1", "--group-size", "32", "--layers", "1"]
    assert int4_matmul.main([*argv, "--output-json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "int4_matmul" and result["group_size"] == 32
    assert [r["projection"] for r in result["runs"]] == ["qkv", "gate_up", "o", "down"]
    hidden, mlp = TINY_CONFIG["hidden_size"], TINY_CONFIG["intermediate_size"]
    down = result["runs"][3]
    assert down["bf16_bytes"] == 2 * mlp * hidden
    assert down["int4_bytes"] == mlp * hidden // 2 + 3 * (mlp // 32) * hidden
    assert all(r["bf16_us"] > 0 and r["int4_pallas_us"] > 0 and r["int4_jnp_us"] > 0 for r in result["runs"])
