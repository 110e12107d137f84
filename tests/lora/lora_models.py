"""A tiny random Llama and PEFT adapters on it, built with `transformers` + `peft`, and one
jitted step of vjx's model with a LoRA slot per token.

The step packs up to NUM_ROWS requests into one padded batch of NUM_TOKENS tokens, each request
in its own fresh blocks of the reference backend's cache, as the runner lays a step out.
"""

import copy
import functools

import jax
import jax.numpy as jnp
import numpy as np
import peft
import torch
import transformers
from flax import nnx

from tests.helpers.families import float32_model_config
from tests.helpers.tiny_llama import randomize_
from vjx.attention.metadata import AttentionMetadata
from vjx.attention.reference import ReferenceBackend
from vjx.attention.sharded import ShardedBackend
from vjx.models.loader import get_model
from vjx.sharding.mesh import model_axis_size
from vjx.sharding.placement import num_cache_kv_heads
from vjx.sharding.rules import logical_sharding
from vjx.worker.kv_cache_layout import kv_cache_axes, kv_cache_shape

VOCAB = 296
HF_CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    attn_implementation="eager",
)
NUM_TOKENS = 48  # T of every step
NUM_ROWS = 3  # R
BLOCK_SIZE = 16
BLOCKS_PER_ROW = 2  # W: a request holds up to 32 tokens
NUM_BLOCKS = 1 + NUM_ROWS * BLOCKS_PER_ROW  # block 0 is the scratch block
MAX_MODEL_LEN = BLOCK_SIZE * BLOCKS_PER_ROW


def save_tiny_llama(model_dir, seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**HF_CONFIG)
    config.architectures = ["LlamaForCausalLM"]
    hf_model = transformers.LlamaForCausalLM(config).eval()
    randomize_(hf_model, seed)
    hf_model.save_pretrained(model_dir)
    return hf_model


def load_vjx(model_dir, mesh=None):
    """vjx's model of `model_dir` in float32, on one device or sharded over `mesh`."""
    backend = ReferenceBackend() if mesh is None else ShardedBackend(ReferenceBackend())
    return get_model(float32_model_config(model_dir, MAX_MODEL_LEN), backend, mesh=mesh)


def save_peft_adapter(hf_model, adapter_dir, seed: int, **lora_config) -> peft.PeftModel:
    """A PEFT LoRA adapter on a copy of `hf_model`, its A and B drawn from `seed` (PEFT starts B
    at zero, which would test nothing), saved to `adapter_dir`; returns the PEFT model."""
    peft_model = peft.get_peft_model(copy.deepcopy(hf_model), peft.LoraConfig(**lora_config)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:  # A [r, in], B [out, r]: terms O(1)
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5)
    peft_model.save_pretrained(adapter_dir, save_embedding_layers=False)
    return peft_model


def torch_logits(hf_model, token_ids) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.as_tensor(np.asarray(token_ids))[None]).logits[0].float().numpy()


def hf_greedy(model, prompt: list[int], num_tokens: int) -> list[int]:
    """transformers' greedy tokens, EOS allowed like any token (as `ignore_eos` does; `generate`'s
    `min_new_tokens` would ban it instead)."""
    token_ids = list(prompt)
    for _ in range(num_tokens):
        token_ids.append(int(torch_logits(model, token_ids)[-1].argmax()))
    return token_ids[len(prompt) :]


@functools.partial(jax.jit, static_argnums=0)
def lora_step(graphdef, state, kv_caches, input_ids, positions, token_slots, md):
    """The runner's step: merge, set the tokens' LoRA slots (None: a model without LoRA), run."""
    model = nnx.merge(graphdef, state)
    if token_slots is not None:
        model.lora_context.token_slots.set_value(token_slots)
    hidden, kv_caches = model(input_ids, positions, kv_caches, [md] * len(kv_caches))
    return model.compute_logits(hidden), kv_caches


def run_requests(model, requests: list[tuple[list[int], int]], *, has_lora: bool = True, mesh=None) -> list[np.ndarray]:
    """Prefills each (token_ids, lora slot) request in one step (on `mesh` if given); the
    logits of each request."""
    lengths = [len(token_ids) for token_ids, _ in requests]
    num_real = sum(lengths)
    pad = NUM_TOKENS - num_real
    slots, block_table = [], np.zeros((NUM_ROWS, BLOCKS_PER_ROW), np.int32)
    for row, length in enumerate(lengths):
        blocks = 1 + row * BLOCKS_PER_ROW + np.arange(BLOCKS_PER_ROW)
        block_table[row] = blocks
        positions = np.arange(length)
        slots.append(blocks[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(np.pad(np.concatenate(slots), (0, pad)), jnp.int32),
        query_start_loc=jnp.asarray(np.pad(starts, (0, NUM_ROWS - len(requests)), mode="edge"), jnp.int32),
        seq_lens=jnp.asarray(np.pad(lengths, (0, NUM_ROWS - len(requests))), jnp.int32),
        block_tables=jnp.asarray(block_table),
        num_seqs=jnp.asarray([len(requests)], jnp.int32),
    )
    input_ids = np.concatenate([token_ids for token_ids, _ in requests])
    positions = np.concatenate([np.arange(length) for length in lengths])
    token_slots = np.concatenate([np.full(length, slot) for (_, slot), length in zip(requests, lengths)])
    graphdef, state = nnx.split(model)
    logits, _ = lora_step(
        graphdef,
        state,
        empty_caches(model, mesh),
        jnp.asarray(np.pad(input_ids, (0, pad)), jnp.int32),
        jnp.asarray(np.pad(positions, (0, pad)), jnp.int32),
        jnp.asarray(np.pad(token_slots, (0, pad), constant_values=-1), jnp.int32) if has_lora else None,
        md,
    )
    logits = np.asarray(logits)
    return [logits[start:end] for start, end in zip(starts[:-1], starts[1:])]


def empty_caches(model, mesh=None) -> list[jax.Array]:
    """Zeroed caches of every layer, on one device or laid out on `mesh` as the engine does."""
    backend = ReferenceBackend()
    num_kv_heads = num_cache_kv_heads(HF_CONFIG["num_key_value_heads"], model_axis_size(mesh))
    specs = model.get_kv_cache_spec(BLOCK_SIZE, num_kv_heads, "float32").values()
    return [
        jax.device_put(
            np.zeros(kv_cache_shape(backend, spec, NUM_BLOCKS, num_state_slots=0), np.float32),
            jax.devices()[0] if mesh is None else logical_sharding(mesh, kv_cache_axes(backend, spec)),
        )
        for spec in specs
    ]
