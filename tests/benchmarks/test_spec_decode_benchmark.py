"""The speculative decoding benchmark end to end on the tiny stand-in model, at toy sizes."""

import json

from benchmarks import spec_decode
from tests.helpers.eagle_head import save_eagle3_head
from tests.helpers.tiny_default_model import save_tiny_default_model


def test_cpu_run_reports_every_method_with_the_same_tokens(tmp_path):
    model = save_tiny_default_model(tmp_path / "tiny")
    path = tmp_path / "spec.json"
    head = save_eagle3_head(tmp_path / "eagle3", model)
    argv = ["--model", model, "--draft-model", model, "--eagle3-head", head]
    argv += ["--workloads", "repetitive", "--num-prompts", "2"]
    argv += ["--output-len", "24"]
    argv += ["--num-speculative-tokens", "3", "--prompt-lookup-min", "1", "--max-model-len", "256"]
    assert spec_decode.main([*argv, "--max-num-batched-tokens", "32", "--output-json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "spec_decode"
    plain, ngram, draft_model, eagle3 = result["runs"]
    assert [run["method"] for run in result["runs"]] == ["none", "ngram", "draft_model", "eagle3"]
    assert [run["output_tokens"] for run in result["runs"]] == [48] * 4
    assert plain["num_drafts"] == 0
    for speculative in (ngram, draft_model, eagle3):
        assert speculative["same_tokens_as_without"] and speculative["num_drafts"] > 0
        assert speculative["mean_acceptance_length"] >= 1.0
    # The target as its own draft: every greedy draft is accepted.
    assert draft_model["acceptance_rate"] == 1.0
    assert not any(run["async_scheduling"] for run in result["runs"])


def test_async_scheduling_on_leaves_the_ngram_proposer_out(tmp_path):
    model = save_tiny_default_model(tmp_path / "tiny")
    path = tmp_path / "spec.json"
    argv = ["--model", model, "--draft-model", model, "--async-scheduling", "on", "--workloads", "random"]
    argv += ["--num-prompts", "1", "2", "--num-iters", "2", "--input-len", "16", "--output-len", "24"]
    argv += ["--num-speculative-tokens", "3", "--max-model-len", "128", "--max-num-batched-tokens", "32"]
    assert spec_decode.main([*argv, "--output-json", str(path)]) == 0
    runs = json.loads(path.read_text())["runs"]
    assert [(run["method"], run["batch_size"]) for run in runs] == [
        ("none", 1),
        ("none", 2),
        ("draft_model", 1),
        ("draft_model", 2),
    ]
    for run in runs:
        assert run["async_scheduling"] and len(run["runs_s"]) == 2
        assert run["output_tokens_per_s_min"] <= run["output_tokens_per_s"] <= run["output_tokens_per_s_max"]
    for draft_model in runs[2:]:
        assert draft_model["same_tokens_as_without"] and draft_model["acceptance_rate"] == 1.0
