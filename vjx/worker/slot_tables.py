"""Per-slot sampling tables kept on the device: each request's dense logit bias and bad words.

A request's logit bias, allowed tokens and bad words never change, so they are written to
its persistent-batch slot once, when it enters the batch, instead of travelling every step.
The step gathers the rows of the slots it samples. A slot whose last occupant had no such
table still holds neutral values (a zero bias row, no bad words).

Legend: R slots (`max_num_seqs`), V vocab, B bad word sequences, W tokens per sequence.
"""

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Sharding

from vjx.sampling_params import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS, SamplingParams
from vjx.sharding.placement import filled


def _set_row(bias, bad_words, slot, bias_row, bad_words_row):
    return bias.at[slot].set(bias_row), bad_words.at[slot].set(bad_words_row)


def has_tables(params: SamplingParams) -> bool:
    return bool(params.logit_bias or params.allowed_token_ids or params.bad_words_token_ids)


class SlotTables:
    """`bias [R, V]` float32 and `bad_words [R, B, W]` int32 (right-aligned, -1 padded), both
    laid out by `sharding` (replicated over the mesh: the sampler reads whole rows)."""

    def __init__(self, num_slots: int, vocab_size: int, sharding: Sharding):
        self.vocab_size = vocab_size
        self.bias = filled((num_slots, vocab_size), np.float32, 0, sharding)
        self.bad_words = filled((num_slots, MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), np.int32, -1, sharding)
        self._is_dirty = np.zeros(num_slots, bool)
        args = (self.bias, self.bad_words, np.int32(0), self.bias[0], self.bad_words[0])
        structs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), args)
        set_row = jax.jit(_set_row, out_shardings=sharding, donate_argnums=(0, 1))
        self._set_row = set_row.lower(*structs).compile()

    @property
    def arrays(self) -> tuple[jax.Array, jax.Array]:
        return self.bias, self.bad_words

    def set_slot(self, slot: int, params: SamplingParams, banned_token_ids: Sequence[int] = ()) -> None:
        """Writes the request's rows (with -inf on `banned_token_ids`), or neutral rows over
        a previous occupant's."""
        is_used = has_tables(params) or bool(banned_token_ids)
        if not is_used and not self._is_dirty[slot]:
            return
        bias_row = self._bias_row(params, banned_token_ids)
        self.bias, self.bad_words = self._set_row(
            self.bias, self.bad_words, np.int32(slot), bias_row, _bad_words_row(params)
        )
        self._is_dirty[slot] = is_used

    def _bias_row(self, params: SamplingParams, banned_token_ids: Sequence[int]) -> np.ndarray:
        row = np.zeros(self.vocab_size, np.float32)
        if params.allowed_token_ids:
            row[:] = -np.inf
            row[[t for t in params.allowed_token_ids if t < self.vocab_size]] = 0.0
        for token_id, bias in (params.logit_bias or {}).items():
            if token_id < self.vocab_size:
                row[token_id] += bias
        row[[t for t in banned_token_ids if t < self.vocab_size]] = -np.inf
        return row


def _bad_words_row(params: SamplingParams) -> np.ndarray:
    row = np.full((MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS), -1, np.int32)
    for i, ids in enumerate(params.bad_words_token_ids or []):
        row[i, MAX_BAD_WORD_TOKENS - len(ids) :] = ids
    return row
