"""The attention metadata of one step: a pytree of padded int32 device arrays.

Legend: T tokens in the padded batch, R request rows (fixed at `max_num_seqs`), R1 = R + 1,
W block table width (`ceil(max_model_len / block_size)`).
Rows are ordered as the runner orders them; padding rows have `seq_len = 0` and an empty
query range; padding tokens (past `query_start_loc[num_seqs]`) write their KV to block 0,
the scratch block that is never handed to a request.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: Int[Array, " T"]
    """Flat cache slot (block_id * block_size + offset) each token's K/V is written to."""
    query_start_loc: Int[Array, " R1"]
    """Row r's query tokens are [query_start_loc[r], query_start_loc[r + 1])."""
    seq_lens: Int[Array, " R"]
    """Keys of row r after this step: cached tokens + this step's tokens."""
    block_tables: Int[Array, "R W"]
    """Row r's KV blocks, in order; entries past the row's last block are 0."""
    num_seqs: Int[Array, "1"]
    """Number of real rows."""


def is_decode_only(md: AttentionMetadata) -> Bool[Array, ""]:
    """Whether every row of the step has at most one query token (a pure decode step)."""
    return jnp.max(jnp.diff(md.query_start_loc)) <= 1
