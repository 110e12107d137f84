"""The packed input buffer of one step: where each field lives, on the host and the device.

Every input of a step travels in ONE int32 buffer (float fields bit-cast into it), moved
with one transfer and sliced on the device at static offsets.

Legend: T tokens (the bucket), R request rows, each attended and sampled: `min(T,
max_num_seqs)`, since every scheduled row has at least one token; G KV cache groups; W block
table width; N the buffer's length.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from vjx.config import CPU_MAX_NUM_BATCHED_TOKENS
from vjx.worker.step_inputs import STEP_INPUTS, StepInputTable

_MIN_TOKEN_BUCKET = 16
_CPU_DECODE_BUCKETS = (1, 8)
"""The CPU's buckets below 16. An accelerator reads the weights in the same time for 1 or 16
tokens; a CPU step's GEMMs grow with the tokens even at decode sizes (SmolLM2-135M, float32,
two cores: 44 ms a decode step at 1 token, about 250 ms padded to 16). Two, not every power of
two, so a CPU engine compiles few variants: one request, and batches up to 8."""


def decode_buckets(platform: str, max_num_batched_tokens: int) -> tuple[int, ...]:
    """The token buckets below 16 that `platform` compiles for this token budget."""
    if platform != "cpu" or max_num_batched_tokens < CPU_MAX_NUM_BATCHED_TOKENS:
        return ()
    return _CPU_DECODE_BUCKETS


YNN_FUSION_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}
"""XLA:CPU compiles its dots to its own Eigen kernels, none to YNNPACK fusions."""


def compiler_options(platform: str, num_tokens: int) -> dict[str, str] | None:
    """XLA options for one bucket's program: the CPU's decode buckets (below 16 tokens) leave
    their dots to XLA's own Eigen kernels instead of YNNPACK fusions, which stream the weights
    more slowly at a few rows (`benchmarks/kernels/cpu_gemm.py`: 4-43% less time at 8 rows
    on SmolLM2-135M's projections; YNNPACK ahead from 64 rows, so larger buckets keep it)."""
    if platform == "cpu" and num_tokens < _MIN_TOKEN_BUCKET:
        return YNN_FUSION_OFF
    return None


def step_variants(platform: str) -> tuple["StepFeatures", ...]:
    """The variants each bucket compiles: PLAIN and GENERAL, or GENERAL alone on the CPU,
    where a run-time conditional costs no wait for the device (two cores, SmolLM2-135M:
    the same decode step time) and every variant is seconds of start-up."""
    return (GENERAL,) if platform == "cpu" else (PLAIN, GENERAL)


def token_buckets(max_num_batched_tokens: int, small_buckets: tuple[int, ...] = ()) -> list[int]:
    """`small_buckets` below 16, then powers of two from 16, closed by
    `max_num_batched_tokens` itself."""
    buckets = [b for b in small_buckets if b < min(_MIN_TOKEN_BUCKET, max_num_batched_tokens)]
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
    variant's features (which do not change the buffer). The fields are the table's
    (vjx/worker/step_inputs.py), in its order."""

    num_tokens: int  # T
    num_reqs: int  # R
    max_num_reqs: int
    max_num_blocks_per_req: int  # W
    max_logprobs: int  # K: static width of the logprobs the step returns
    num_kv_cache_groups: int = 1  # G: one block table and slot mapping each
    num_bitmask_words: int = 1  # M: int32 words of a row's grammar bitmask, ceil(V / 32)
    num_spec_tokens: int = 0  # k: draft tokens a row may verify (speculative decoding)
    returns_hidden_states: bool = False  # the step also returns its tokens' final hidden states (EAGLE)
    aux_hidden_state_layers: tuple[int, ...] = ()  # instead, the residual streams entering these layers (EAGLE-3)
    block_size: int = 0  # KV block size, for slots the step computes itself (drafts under async scheduling)
    features: StepFeatures = GENERAL
    table: StepInputTable = dataclasses.field(default=STEP_INPUTS, repr=False, compare=False)

    @functools.cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        dims = {
            "T": self.num_tokens,
            "R": self.num_reqs,
            "R1": self.num_reqs + 1,
            "S": self.num_samples,
            "1": 1,
            "G": self.num_kv_cache_groups,
            "max_num_blocks_per_req": self.max_num_blocks_per_req,
        }
        return {row.name: row.shape(dims) for row in self.table.inputs}

    @property
    def num_samples(self) -> int:
        """S: sampling positions, one per row, with drafts one per row and draft (at most T)."""
        return min(self.num_tokens, self.num_reqs * (self.num_spec_tokens + 1))

    @property
    def max_num_samples(self) -> int:
        """Sampling positions of the largest bucket."""
        return self.max_num_reqs * (self.num_spec_tokens + 1)

    @property
    def sampled_size(self) -> int:
        """Length of the sampled-token array, the same for every bucket: a token per sampling
        position, then (with drafts) each row's rejected drafts and the k drafts proposed for
        its next step (async scheduling: vjx/spec_decode/async_drafts.py)."""
        return self.max_num_samples + (self.max_num_reqs * (1 + self.num_spec_tokens) if self.num_spec_tokens else 0)

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
        """The value of each field's entries that no token or row of the step fills."""
        return {
            row.name: getattr(self, row.padding) if isinstance(row.padding, str) else row.padding
            for row in self.table.inputs
        }

    @property
    def size(self) -> int:
        return max(end for _, end in self.fields.values())

    def view(self, packed: np.ndarray, name: str) -> np.ndarray:
        """The host buffer's slice for `name`, in its shape (float fields as float32)."""
        start, end = self.fields[name]
        part = packed[start:end].reshape(self.shapes[name])
        return part.view(np.float32) if self.table[name].dtype is np.float32 else part

    def unpack(self, packed: Int[Array, " N"]) -> dict[str, Array]:
        """Every field as a device array of its shape and dtype."""
        out = {}
        for row in self.table.inputs:
            start, end = self.fields[row.name]
            part = packed[start:end].reshape(self.shapes[row.name])
            if row.dtype is np.float32:
                part = jax.lax.bitcast_convert_type(part, jnp.float32)
            elif row.dtype is np.bool_:
                part = part != 0
            out[row.name] = part
        return out


class PackedBuffer:
    """One host buffer of a layout, reused step after step, with a view of every field.

    Every field but the block tables is reset to its padding and rewritten each step. The
    block tables are most of the buffer (G x R x W) and mostly zeros (the scratch block, past
    each row's last block), so only their used corners change: the rows x blocks of each
    group the buffer's previous step wrote are cleared, then this step's are copied in. The
    buffer then holds exactly what a whole refill would give.
    """

    def __init__(self, layout: StepLayout):
        self.layout = layout
        self.data = np.zeros(layout.size, np.int32)
        self.fields = {name: layout.view(self.data, name) for name in layout.shapes}
        for name, value in layout.padding.items():
            self.fields[name][...] = value
        self._head = self.data[: layout.fields["block_tables"][0]]
        self._padding = self._head.copy()
        self._table_extents = [(0, 0)] * layout.num_kv_cache_groups
        """Per group, (rows, blocks) of the block table's corner that holds entries."""

    def reset(self) -> None:
        """Every field but the block tables back to its padding (`StepLayout.padding`), in one copy."""
        np.copyto(self._head, self._padding)

    def set_block_tables(self, block_table: np.ndarray, rows: np.ndarray, num_blocks: int, group: int = 0) -> None:
        """Rows `rows` of KV cache group `group`'s `block_table` (entries past `num_blocks` are
        all zero) as rows 0.. of the group's table."""
        table = self.fields["block_tables"][group]
        num_used_rows, num_used_blocks = self._table_extents[group]
        table[:num_used_rows, :num_used_blocks] = 0
        table[: len(rows), :num_blocks] = block_table[rows, :num_blocks]
        self._table_extents[group] = (len(rows), num_blocks)


def ragged_positions(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of `counts[i]` tokens from position `starts[i]`, packed back to back: each
    token's row, the rows' cumulative ends, and each token's position."""
    row_of_token = np.repeat(np.arange(len(counts)), counts)
    cu = np.cumsum(counts)
    positions = starts[row_of_token] + np.arange(len(row_of_token)) - (cu - counts)[row_of_token]
    return row_of_token, cu, positions


def query_start_loc(cu: np.ndarray, num_reqs: int) -> np.ndarray:
    """The `query_start_loc` field of rows ending at `cu`, padded to `num_reqs` rows (the
    padding rows empty, at the end)."""
    out = np.full(num_reqs + 1, cu[-1], np.int32)
    out[0] = 0
    out[1 : len(cu) + 1] = cu
    return out
