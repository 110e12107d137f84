"""Tiny random Llama checkpoints for the parallelism and sharding tests, saved by
`transformers`, and `randomize_`, the weight init of every random HF model in the tests.

Eight query heads, so tensor parallelism of 1, 2, 4 and 8 splits them evenly; the KV head
count varies (8, 4, 2, 1: down to one head, repeated on every device). Weights are scaled
so that logits are O(1) (HF's std-0.02 init gives near ties), and the vocabulary (296, a
multiple of 8) stays inside the test tokenizer's 300 ids.
"""

import numpy as np
import torch
import transformers

from tests.helpers.tokenizer import make_tokenizer

VOCAB = 296
NUM_HEADS = 8
HEAD_DIM = 8
HIDDEN = NUM_HEADS * HEAD_DIM
MLP = 128
PROMPTS = [{"prompt_token_ids": [(7 * i + 3 * j) % 290 + 2 for j in range(5 + 9 * i)]} for i in range(4)]
"""Four prompts of 5 to 32 tokens, so a 16-token budget chunks the longer ones."""
ENGINE_ARGS = dict(
    max_model_len=64,
    max_num_seqs=4,
    max_num_batched_tokens=16,
    num_gpu_blocks_override=32,
    multiprocess=False,
    async_scheduling=False,
)
"""One 16-token bucket: the cheapest compile, and every step mixes prefill chunks with decodes."""


def randomize_(hf_model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that logits are O(1): HF's init (std 0.02) would hide errors."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if "norm" in name:
                param.copy_(1.0 + 0.1 * noise)
            elif "embed" in name:  # also the tied LM head: logits of std ~2
                param.copy_(noise * 2.0 / param.shape[1] ** 0.5)
            elif param.ndim == 1:
                param.copy_(0.1 * noise)
            else:
                param.copy_(noise / param.shape[1] ** 0.5)


def tiny_config(num_kv_heads: int, **overrides) -> transformers.LlamaConfig:
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_hidden_layers=2,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=num_kv_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    config = transformers.LlamaConfig(**{**fields, **overrides})
    config.architectures = ["LlamaForCausalLM"]
    return config


def save_tiny_llama(path, num_kv_heads: int, seed: int = 0, **overrides) -> transformers.LlamaForCausalLM:
    """Writes config, safetensors weights and the test tokenizer to `path`; returns the HF model."""
    torch.manual_seed(seed)
    hf_model = transformers.LlamaForCausalLM(tiny_config(num_kv_heads, **overrides)).eval()
    randomize_(hf_model, seed)
    hf_model.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return hf_model


def transformers_logprobs(hf_model, prompt_ids: list[int], output_ids: list[int]):
    """The float32 transformers model's float64 log-probabilities [len(output_ids), V] of the
    token after each prefix of `output_ids` (one forward pass over the whole sequence)."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt_ids + output_ids])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.double(), -1).numpy()


def assert_greedy_like_transformers(hf_model, prompts, outputs, atol: float) -> None:
    """vjx's greedy outputs (with 5 logprobs) against the float32 transformers model: tokens
    equal, or at the first difference each side's token in the other's top 5; up to there
    the top-5 logprobs within `atol`."""
    for prompt, output in zip(prompts, outputs, strict=True):
        got = output.outputs[0]
        expected = transformers_logprobs(hf_model, prompt["prompt_token_ids"], list(got.token_ids))
        for token, top, want in zip(got.token_ids, got.logprobs, expected, strict=True):
            np.testing.assert_allclose([lp.logprob for lp in top.values()], want[list(top)], atol=atol)
            if token != want.argmax():
                assert want.argmax() in top and token in np.argsort(want)[-5:]
                break
