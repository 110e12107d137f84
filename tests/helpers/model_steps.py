"""One request through vjx's model on the reference backend, outside the engine: a prefill of
some tokens after `num_cached` cached ones, into a shuffled, non-contiguous block table.

Every prefill is padded to one of two shapes (DECODE_TOKENS or NUM_TOKENS tokens, NUM_ROWS
rows), so two compiles serve every prompt and decode step of a model config.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tests.helpers.quick_compile import quick_jit
from vjx.attention.metadata import AttentionMetadata
from vjx.attention.reference import ReferenceBackend

NUM_TOKENS = 384  # T: every prefill is padded to this
DECODE_TOKENS = 8  # ... or, when it has no more tokens, to this (decode steps)
NUM_ROWS = 2  # R: row 1 is a padding row
BLOCK_SIZE = 16
NUM_BLOCKS = 40
WIDTH = NUM_TOKENS // BLOCK_SIZE  # W


@functools.partial(quick_jit, static_argnums=0, donate_argnums=2)
def _step(graphdef, state, kv_caches, input_ids, positions, md):
    model = nnx.merge(graphdef, state)
    hidden, kv_caches = model(input_ids, positions, kv_caches, [md] * len(kv_caches))
    return model.compute_logits(hidden), kv_caches


def prefill(model, token_ids, num_cached, block_ids, kv_caches):
    """Runs `token_ids` as one request whose first `num_cached` tokens are already cached."""
    num_new = len(token_ids)
    positions = np.arange(num_cached, num_cached + num_new)
    slots = np.asarray(block_ids)[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
    pad = (DECODE_TOKENS if num_new <= DECODE_TOKENS else NUM_TOKENS) - num_new
    block_table = np.zeros((NUM_ROWS, WIDTH), np.int32)
    block_table[0, : len(block_ids)] = block_ids
    md = AttentionMetadata(
        slot_mapping=jnp.asarray(np.pad(slots, (0, pad)), jnp.int32),
        query_start_loc=jnp.asarray([0, num_new, num_new], jnp.int32),
        seq_lens=jnp.asarray([num_cached + num_new, 0], jnp.int32),
        block_tables=jnp.asarray(block_table),
        num_seqs=jnp.asarray([1], jnp.int32),
    )
    graphdef, state = nnx.split(model)
    logits, kv_caches = _step(
        graphdef,
        state,
        kv_caches,
        jnp.asarray(np.pad(token_ids, (0, pad)), jnp.int32),
        jnp.asarray(np.pad(positions, (0, pad)), jnp.int32),
        md,
    )
    return np.asarray(logits)[:num_new], kv_caches


def empty_caches(hf_config):
    head_dim = getattr(hf_config, "head_dim", None) or (hf_config.hidden_size // hf_config.num_attention_heads)
    shape = ReferenceBackend().kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE, hf_config.num_key_value_heads, head_dim)
    # Committed like the caches a step returns, so the second chunk reuses the compiled step.
    zeros = jax.device_put(np.zeros(shape, np.float32), jax.devices()[0])
    return [zeros.copy() for _ in range(hf_config.num_hidden_layers)]


def random_blocks(seed):
    """A shuffled, non-contiguous block table that never uses the scratch block 0."""
    return list(np.random.default_rng(seed).permutation(np.arange(1, NUM_BLOCKS))[:WIDTH])
