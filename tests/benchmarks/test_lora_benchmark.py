"""The LoRA benchmark: random PEFT adapters for a model's shapes, and a CPU run end to end."""

import json

import pytest

from benchmarks import lora
from tests.helpers.tokenizer import make_tokenizer
from tests.lora.lora_models import HF_CONFIG, save_tiny_llama
from vjx.lora.peft_loader import load_peft_adapter


def test_random_adapters_load_with_every_projection(tmp_path):
    config = {**HF_CONFIG, "num_hidden_layers": 2}
    lora.write_adapter(tmp_path / "adapter", config, rank=4, seed=0)
    adapter = load_peft_adapter(str(tmp_path / "adapter"), max_lora_rank=4)
    assert (adapter.rank, adapter.scaling) == (4, 2.0)
    assert len(adapter.weights) == 2 * 7
    assert adapter.weights[(1, "k_proj")].lora_b.shape == (2 * 16, 4)


def test_cpu_run_times_every_adapter_count(tmp_path):
    save_tiny_llama(tmp_path)
    make_tokenizer().save_pretrained(tmp_path)
    path = tmp_path / "lora.json"
    engine = ["--model", str(tmp_path), "--enable-lora", "--max-loras", "2", "--max-lora-rank", "4"]
    engine += ["--max-model-len", "64", "--max-num-seqs", "4", "--max-num-batched-tokens", "32"]
    workload = ["--num-adapters", "0", "2", "--lora-rank", "4", "--batch-size", "2", "--input-len", "8"]
    workload += ["--output-len", "3", "--num-iters-warmup", "0", "--num-iters", "1", "--output-json", str(path)]
    assert lora.main([*engine, *workload]) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "lora" and [run["num_adapters"] for run in result["runs"]] == [0, 2]
    assert all(run["request_s"] > 0 and run["prefill_s"] > 0 for run in result["runs"])


def test_needs_enable_lora(tmp_path):
    with pytest.raises(ValueError, match="benchmarks.lora needs --enable-lora"):
        lora.main(["--model", str(tmp_path), "--num-adapters", "1"])
