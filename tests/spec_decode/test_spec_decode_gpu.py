"""Speculative decoding on the GPU backend (Pallas attention): Llama-3.1-8B's layer shapes
(4 layers, random float32 weights, a 49152-token vocabulary so that the embedded model's
tokenizer covers it), each method's greedy outputs equal to the engine's without drafts
(float32: in bfloat16 a token verified inside a multi-token query and the same token decoded
alone round differently, and a random model's near-ties then flip), and the target as its
own draft model has its drafts accepted. The draft model is the same shapes with one layer;
the EAGLE head one layer with `fc`, the EAGLE-3 head one layer reading three of the target's
layers, with a 32000-token draft vocabulary.

Run on the lent GPU with the tokenizer at $VJX_TEST_TOKENIZER (default: the embedded
model's): `pytest -o addopts="" -m gpu -s tests/spec_decode/test_spec_decode_gpu.py` (the
device has no beartype for the test suite's jaxtyping hook)."""

import json
import os
import pathlib
import time

import pytest

from vjx import LLM, SamplingParams

pytestmark = pytest.mark.gpu

_CONFIG = pathlib.Path(__file__).parents[2] / "benchmarks/configs/llama-3.1-8b/config.json"
_ENGINE_ARGS = dict(
    max_model_len=512, max_num_seqs=4, max_num_batched_tokens=64, load_format="dummy", dtype="float32", seed=0
)
_PROMPTS = [[(7 * i + 3) % 1000 + 10 for i in range(48)], [(i % 12) + 100 for i in range(40)]]
_PARAMS = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)


def _model_dir(path: pathlib.Path, num_layers: int, **fields) -> str:
    config = json.loads(_CONFIG.read_text())
    config.update(num_hidden_layers=num_layers, vocab_size=49152, bos_token_id=1, eos_token_id=2, **fields)
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _tokenizer() -> str:
    from vjx.models.default_model import get_default_model_path

    return os.environ.get("VJX_TEST_TOKENIZER") or get_default_model_path()


def _run(target: str, speculative_config=None):
    llm = LLM(target, tokenizer=_tokenizer(), speculative_config=speculative_config, **_ENGINE_ARGS)
    try:
        prompts = [{"prompt_token_ids": ids} for ids in _PROMPTS]
        llm.generate(prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
        start = time.perf_counter()
        outputs = llm.generate(prompts, _PARAMS, use_tqdm=False)
        elapsed = time.perf_counter() - start
        stats = llm.llm_engine.engine_core.make_stats().spec_decoding_stats
        print(f"{speculative_config and speculative_config['method']}: {elapsed:.3f} s, {stats}")
        return [list(o.outputs[0].token_ids) for o in outputs], stats
    finally:
        llm.shutdown()


def test_each_method_gives_the_outputs_without_drafts(tmp_path):
    target, small = _model_dir(tmp_path / "target", 4), _model_dir(tmp_path / "draft", 1)
    eagle3 = _model_dir(
        tmp_path / "eagle3",
        1,
        draft_vocab_size=32000,
        eagle_aux_hidden_state_layer_ids=[1, 2, 4],
        tie_word_embeddings=False,
    )
    reference, _ = _run(target)
    for config in (
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
        {"method": "draft_model", "model": small, "num_speculative_tokens": 3},
        {"method": "eagle", "model": small, "num_speculative_tokens": 3},
        {"method": "eagle3", "model": eagle3, "num_speculative_tokens": 3},
    ):
        assert _run(target, config)[0] == reference, config["method"]
    outputs, stats = _run(target, {"method": "draft_model", "model": target, "num_speculative_tokens": 3})
    assert outputs == reference
    assert stats.num_accepted_tokens >= 0.9 * stats.num_draft_tokens > 0
