"""One step's rows as a Mamba layer sees them, derived from its `AttentionMetadata`.

Legend: T tokens in the padded batch, R request rows, R1 = R + 1.

A Mamba layer keeps one state slot per request instead of pages: row r's slot is its first
block id, `block_tables[r, 0]` (block 0 is the scratch slot, never a request's). A row
continues from the state stored in its slot when it had tokens before this step (a decode,
the next chunk of a chunked prefill); otherwise (a fresh prompt, a recompute after
preemption) its state starts at zero and whatever the slot holds is never read.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from vjx.attention.metadata import AttentionMetadata


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MambaRows:
    token_row: Int[Array, " T"]
    """The row each token belongs to (padding tokens: clamped to the last row)."""
    token_offset: Int[Array, " T"]
    """Each token's index among its row's tokens of this step."""
    is_real_token: Bool[Array, " T"]
    """False for the padding tokens past `query_start_loc[num_seqs]`."""
    query_start_loc: Int[Array, " R1"]
    """Row r's tokens are [query_start_loc[r], query_start_loc[r + 1])."""
    query_lens: Int[Array, " R"]
    """Tokens of row r in this step (0 for padding rows)."""
    state_indices: Int[Array, " R"]
    """Row r's state slot, `block_tables[r, 0]`."""
    has_initial_states: Bool[Array, " R"]
    """Whether row r continues from the state stored in its slot."""
    is_real_row: Bool[Array, " R"]
    """False for the padding rows past `num_seqs`."""

    def initial_states(self, state: Float[Array, "S ..."]) -> Float[Array, "R ..."]:
        """Each row's state before the step in float32: its slot's for a continuing row, else 0."""
        stored = state[self.state_indices].astype(jnp.float32)
        is_stored = self.has_initial_states.reshape(-1, *(1,) * (state.ndim - 1))
        return jnp.where(is_stored, stored, 0.0)

    def write_states(self, state: Float[Array, "S ..."], new: Float[Array, "R ..."]) -> Float[Array, "S ..."]:
        """Writes each real row's new state to its slot; padding rows write nothing, so every
        slot no real row owns (the scratch slot 0 too) keeps its contents."""
        past_end = state.shape[0]
        slots = jnp.where(self.is_real_row, self.state_indices, past_end)
        return state.at[slots].set(new.astype(state.dtype), mode="drop")


def mamba_rows(md: AttentionMetadata, num_tokens: int) -> MambaRows:
    """The rows and tokens of one step of `num_tokens` (padded) tokens."""
    starts = md.query_start_loc
    num_rows = md.seq_lens.shape[0]
    token = jnp.arange(num_tokens, dtype=starts.dtype)
    token_row = jnp.minimum(jnp.searchsorted(starts[1:], token, side="right"), num_rows - 1).astype(starts.dtype)
    query_lens = jnp.diff(starts)
    is_real_row = jnp.arange(num_rows) < md.num_seqs[0]
    return MambaRows(
        token_row=token_row,
        token_offset=token - starts[token_row],
        is_real_token=token < starts[md.num_seqs[0]],
        query_start_loc=starts,
        query_lens=query_lens,
        state_indices=md.block_tables[:, 0],
        has_initial_states=is_real_row & (md.seq_lens - query_lens > 0),
        is_real_row=is_real_row,
    )
