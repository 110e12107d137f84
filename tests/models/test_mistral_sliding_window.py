"""A Mistral-style config with `sliding_window` runs in a sliding-window KV cache group: its
out-of-window blocks go back to the pool while the request runs, so a pool of 8 blocks of 16
tokens carries one request to 320 tokens, and the tokens match transformers' greedy ones.
The same pool with the window ignored (full attention) could not hold that request."""

import pytest
import torch
import transformers

from tests.helpers.tiny_llama import HEAD_DIM, HIDDEN, MLP, NUM_HEADS, VOCAB, randomize_
from tests.helpers.tokenizer import make_tokenizer
from vjx import LLM, SamplingParams

WINDOW = 32
NUM_OUTPUT_TOKENS = 300
PROMPT = [(11 * j) % 290 + 2 for j in range(20)]
ENGINE_ARGS = dict(
    block_size=16,
    num_gpu_blocks_override=8,
    max_model_len=512,
    max_num_seqs=4,
    max_num_batched_tokens=16,
    multiprocess=False,
    async_scheduling=False,
)
"""Block 0 is reserved: 7 blocks (112 tokens) for a request that grows to 320; one 16-token bucket."""


def _mistral_config(sliding_window: int | None) -> transformers.MistralConfig:
    config = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_hidden_layers=2,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=512,
        sliding_window=sliding_window,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    config.architectures = ["MistralForCausalLM"]
    return config


def _save(path, sliding_window: int | None) -> transformers.MistralForCausalLM:
    torch.manual_seed(0)
    hf_model = transformers.MistralForCausalLM(_mistral_config(sliding_window)).eval()
    randomize_(hf_model, 0)
    hf_model.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return hf_model


def _hf_greedy(hf_model, num_tokens: int) -> tuple[list[int], list[list[int]]]:
    """Greedy tokens and each step's top-5 ids (a full forward per step, float32)."""
    ids, tokens, top5 = list(PROMPT), [], []
    with torch.no_grad():
        for _ in range(num_tokens):
            logits = hf_model(torch.as_tensor([ids])).logits[0, -1]
            top5.append(torch.topk(logits, 5).indices.tolist())
            tokens.append(int(logits.argmax()))
            ids.append(tokens[-1])
    return tokens, top5


@pytest.fixture(scope="module")
def windowed_hf_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("mistral-window")
    return path, _save(path, WINDOW)


def test_a_window_of_32_runs_300_tokens_in_8_blocks_and_matches_transformers(windowed_hf_model):
    path, hf_model = windowed_hf_model
    llm = LLM(str(path), **ENGINE_ARGS)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT_TOKENS, ignore_eos=True, logprobs=5)
    (output,) = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec.sliding_window == WINDOW
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 7
    llm.shutdown()
    ours = list(output.outputs[0].token_ids)
    assert len(ours) == NUM_OUTPUT_TOKENS
    theirs, their_top5 = _hf_greedy(hf_model, NUM_OUTPUT_TOKENS)
    if ours != theirs:
        i = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        our_top5 = list(output.outputs[0].logprobs[i])
        assert ours[i] in their_top5[i] and theirs[i] in our_top5, (i, ours, theirs)


def test_the_window_changes_transformers_tokens(windowed_hf_model):
    """Without its window the same weights give other tokens: the match above needs the window."""
    _, hf_model = windowed_hf_model
    full = transformers.MistralForCausalLM(_mistral_config(None)).eval()
    full.load_state_dict(hf_model.state_dict())
    assert _hf_greedy(full, 100)[0] != _hf_greedy(hf_model, 100)[0]


def test_the_same_pool_with_the_window_ignored_is_refused(tmp_path):
    _save(tmp_path, None)
    with pytest.raises(ValueError, match="num_gpu_blocks=8 holds 112 tokens .* max_model_len=512"):
        LLM(str(tmp_path), **ENGINE_ARGS)
