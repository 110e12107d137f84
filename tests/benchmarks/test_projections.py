"""The projection GEMM benchmark: shapes from a config, and a CPU run end to end."""

import json
import pathlib

from benchmarks.kernels import projections
from benchmarks.roofline import ModelShape
from tests.helpers.benchmark_model import TINY_CONFIG


def test_shapes_of_llama_3_1_8b():
    config = json.loads((pathlib.Path(__file__).parents[2] / "benchmarks/configs/llama-3.1-8b/config.json").read_text())
    shapes = projections.projection_shapes(ModelShape.from_hf_config(config, "bfloat16"))
    assert shapes["qkv"] == ([(4096, 4096), (4096, 1024), (4096, 1024)], [(4096, 6144)])
    assert shapes["gate_up"] == ([(4096, 14336), (4096, 14336)], [(4096, 28672)])
    assert shapes["down"] == ([(14336, 4096)], [(14336, 4096)])


def test_cpu_run_writes_every_projection(tiny_model_dir, tmp_path):
    path = tmp_path / "projections.json"
    argv = ["--model", tiny_model_dir, "--num-tokens", "1", "4", "--layers", "2", "--output-json", str(path)]
    assert projections.main(argv) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "projections" and result["layers"] == 2
    assert [(r["num_tokens"], r["projection"]) for r in result["runs"]] == [
        (n, p) for n in (1, 4) for p in ("qkv", "gate_up", "o", "down")
    ]
    hidden, mlp = TINY_CONFIG["hidden_size"], TINY_CONFIG["intermediate_size"]
    assert result["runs"][1]["weight_bytes"] == 2 * hidden * 2 * mlp
    assert all(r["separate_us"] > 0 and r["fused_us"] > 0 for r in result["runs"])
