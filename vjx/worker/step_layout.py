"""The packed input buffer of one step: where each field lives, on the host and the device.

Every input of a step travels in ONE int32 buffer (float fields bit-cast into it), moved
with one transfer and sliced on the device at static offsets.

Legend: T tokens (the bucket), R request rows, each attended and sampled: `min(T,
max_num_seqs)`, since every scheduled row has at least one token; W block table width.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from vjx.sampling_params import MAX_MIN_TOKENS_STOP_IDS

_MIN_TOKEN_BUCKET = 16
_FLOAT_FIELDS = frozenset({"temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                           "repetition_penalty"})


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """Powers of two from 16, closed by `max_num_batched_tokens` itself."""
    buckets = []
    size = _MIN_TOKEN_BUCKET
    while size < max_num_batched_tokens:
        buckets.append(size)
        size *= 2
    buckets.append(max_num_batched_tokens)
    return buckets


@dataclasses.dataclass(frozen=True)
class StepFeatures:
    """What a step's sampling may need beyond greedy and temperature draws (static).

    Each bucket is compiled twice: `PLAIN` leaves filters, logits processors and logprobs
    out, so the program has no run-time conditional (on a GPU, XLA reads a conditional's
    predicate on the host, which makes the step's dispatch wait for the device); `GENERAL`
    has them all, each behind a run-time check. The runner picks PLAIN when no row of the
    step uses any of them.
    """

    may_filter: bool = True
    """Some row may use min-p, top-k or top-p."""
    may_process: bool = True
    """Some row may use penalties, logit bias, allowed tokens, bad words or min_tokens."""
    has_logprobs: bool = True
    has_prompt_logprobs: bool = True


GENERAL = StepFeatures()
PLAIN = StepFeatures(may_filter=False, may_process=False, has_logprobs=False, has_prompt_logprobs=False)


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """Field offsets of the packed buffer for one bucket (all sizes static), and the compiled
    variant's features (which do not change the buffer)."""

    num_tokens: int  # T
    num_reqs: int  # R
    max_num_reqs: int  # length of the sampled-token array, the same for every bucket
    max_num_blocks_per_req: int  # W
    max_logprobs: int  # K: static width of the logprobs the step returns
    features: StepFeatures = GENERAL

    @functools.cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        t, r = self.num_tokens, self.num_reqs
        return {
            # per token
            "input_ids": (t,),
            "prev_sampled_index": (t,),  # -1: the host knows the token
            "positions": (t,),
            "slot_mapping": (t,),
            "token_slots": (t,),  # persistent-batch slot (R: padding), for the token history
            "prompt_logprobs_targets": (t,),  # next prompt token when asked for, else -1
            # per attention row
            "query_start_loc": (r + 1,),
            "seq_lens": (r,),
            "num_seqs": (1,),
            # per sampled row (row i is attention row i)
            "logits_indices": (r,),
            "sample_slots": (r,),
            "temperature": (r,),
            "top_k": (r,),
            "top_p": (r,),
            "min_p": (r,),
            "presence_penalty": (r,),
            "frequency_penalty": (r,),
            "repetition_penalty": (r,),
            "seeds": (r,),
            "sample_positions": (r,),
            "num_prompt_tokens": (r,),
            "num_logprobs": (r,),  # -1: none
            "is_below_min_tokens": (r,),
            "has_logit_bias": (r,),
            "stop_token_ids": (r, MAX_MIN_TOKENS_STOP_IDS),  # padded with -1
            # last, so the fields before it are cleared with one fill (see PackedBuffer)
            "block_tables": (r, self.max_num_blocks_per_req),
        }

    @functools.cached_property
    def fields(self) -> dict[str, tuple[int, int]]:
        offsets, start = {}, 0
        for name, shape in self.shapes.items():
            size = int(np.prod(shape))
            offsets[name] = (start, start + size)
            start += size
        return offsets

    @functools.cached_property
    def padding(self) -> dict[str, float | int]:
        """The value of each field's entries that no token or row of the step fills (fields
        not named here pad with 0)."""
        return {
            "prev_sampled_index": -1,
            "token_slots": self.max_num_reqs,  # the history's scratch row
            "prompt_logprobs_targets": -1,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "num_logprobs": -1,
            "stop_token_ids": -1,
        }

    @property
    def size(self) -> int:
        return max(end for _, end in self.fields.values())

    def view(self, packed: np.ndarray, name: str) -> np.ndarray:
        """The host buffer's slice for `name`, in its shape (float fields as float32)."""
        start, end = self.fields[name]
        part = packed[start:end].reshape(self.shapes[name])
        return part.view(np.float32) if name in _FLOAT_FIELDS else part

    def unpack(self, packed: jax.Array) -> dict[str, jax.Array]:
        """Every field as a device array of its shape and dtype."""
        out = {}
        for name, (start, end) in self.fields.items():
            part = packed[start:end].reshape(self.shapes[name])
            if name in _FLOAT_FIELDS:
                part = jax.lax.bitcast_convert_type(part, jnp.float32)
            out[name] = part
        return out


class PackedBuffer:
    """One host buffer of a layout, reused step after step, with a view of every field.

    Every field but the block table is reset to its padding and rewritten each step. The
    block table is most of the buffer (R x W) and mostly zeros (the scratch block, past each
    row's last block), so only its used corner changes: the rows x blocks the buffer's previous step
    wrote are cleared, then this step's are copied in. The buffer then holds exactly what a
    whole refill would give.
    """

    def __init__(self, layout: StepLayout):
        self.data = np.zeros(layout.size, np.int32)
        self.fields = {name: layout.view(self.data, name) for name in layout.shapes}
        for name, value in layout.padding.items():
            self.fields[name][...] = value
        self._head = self.data[: layout.fields["block_tables"][0]]
        self._padding = self._head.copy()
        self._table_extent = (0, 0)
        """(rows, blocks) of the block table's corner that holds entries."""

    def reset(self) -> None:
        """Every field but the block table back to its padding (`StepLayout.padding`), in one copy."""
        np.copyto(self._head, self._padding)

    def set_block_tables(self, block_table: np.ndarray, rows: np.ndarray, num_blocks: int) -> None:
        """Rows `rows` of `block_table` (entries past `num_blocks` are all zero) as rows 0.. ."""
        table = self.fields["block_tables"]
        num_used_rows, num_used_blocks = self._table_extent
        table[:num_used_rows, :num_used_blocks] = 0
        table[: len(rows), :num_blocks] = block_table[rows, :num_blocks]
        self._table_extent = (len(rows), num_blocks)
