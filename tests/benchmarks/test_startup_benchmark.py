"""`benchmarks.startup` end to end on the tiny random Llama (CPU): it writes a random sharded
safetensors checkpoint (nothing zero but the norms' ones), then times a cold and a warm start in
fresh processes, and records both with the run's provenance."""

import json

import numpy as np
from safetensors.numpy import load_file

from benchmarks import startup
from tests.helpers.benchmark_model import ENGINE_FLAGS


def test_cold_and_warm_starts_from_written_safetensors(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(startup, "SHARD_BYTES", 64 * 1024)  # several shards even for this model
    weights = tmp_path / "weights"
    path = tmp_path / "startup.json"
    flags = [f for f in ENGINE_FLAGS if f not in ("--load-format", "dummy")]
    argv = ["--model", tiny_model_dir, "--dtype", "float32", *flags, "--weights-dir", str(weights)]
    assert startup.main([*argv, "--repeats", "1", "--output-json", str(path)]) == 0
    result = json.loads(path.read_text())
    index = json.loads((weights / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert result["bytes_written"] == index["metadata"]["total_size"] <= result["checkpoint_bytes"]
    tensors = {k: v for shard in weights.glob("*.safetensors") for k, v in load_file(shard).items()}
    assert set(tensors) == set(index["weight_map"])
    assert all(np.all(v == 1) if "norm" in k else np.std(v) > 0.01 for k, v in tensors.items())
    for run in ("cold", "warm"):
        (only,) = result[run]
        assert only["ready_s"] > only["construct_s"] > only["warmup_s"] > 0 and only["load_s"] > 0
        assert result["summary"][run]["ready_s"]["median"] == only["ready_s"]
    assert result["benchmark"] == "startup" and result["git_sha"]
    assert startup.write_random_checkpoint(tiny_model_dir, weights, "float32", None) == 0, "kept, not rewritten"
