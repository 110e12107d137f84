"""The draft model proposer: a smaller model with the target's vocabulary proposes its
greedy tokens, on the device, with a KV cache of its own.

The draft's cache has the target's blocks: the same block ids (the scheduler's), the same
block size, arrays of its own shape, so the block tables and slot mappings are the target's.
After each target step, for every row of the step:

1. catch-up: one ragged forward over the tokens the target has computed and the draft has
   not (a prompt chunk, or the accepted drafts of a decoding row), writing their draft KV;
2. decode: for the rows that may take drafts, k one-token steps from the row's newest token
   (the one the step drew), each writing its KV and taking the argmax as the next draft.

Step 2 writes up to k - 1 positions past the row's tokens: the scheduler allocates that many
slots ahead (`SchedulerConfig.num_lookahead_tokens`). The draft counts as computed only the
request's tokens (`num_computed`); drafts the target then accepts are computed again by the
next catch-up, which overwrites the same slots. A proposal only changes how many drafts are
accepted, never which tokens the request gets.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vjx.attention.metadata import AttentionMetadata
from vjx.sharding.constraints import replicate
from vjx.sharding.placement import abstract_like, put_replicated
from vjx.spec_decode.async_drafts import correct_optimistic_fields, drafting_inputs, with_drafts
from vjx.worker.input_batch import InputBatch
from vjx.worker.step import layer_attention_metadata, step_input_ids
from vjx.worker.step_inputs import STEP_INPUTS
from vjx.worker.step_layout import PLAIN, PackedBuffer, StepLayout, query_start_loc, ragged_positions
from vjx.worker.step_outputs import StepRecord


def _catch_up(layout: StepLayout, num_layers: int, graphdef, treedef, param_leaves, kv_caches, packed):
    """The draft's forward over a ragged batch, for its KV only."""
    f = layout.unpack(packed)
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, param_leaves))
    metadata = layer_attention_metadata(layout, (0,) * num_layers, f)
    _, kv_caches = model(f["input_ids"], f["positions"], kv_caches, metadata)
    return kv_caches


def _decode(k: int, block_size: int, max_model_len: int, graphdef, treedef, param_leaves, kv_caches, inputs):
    """k greedy one-token steps per row from (tokens, positions); returns the caches and the
    drafts [rows, k]. Rows past `num_rows`, and positions past the model length, write to
    the scratch block."""
    tokens, positions, block_tables, num_rows = inputs
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, param_leaves))
    rows = jnp.arange(tokens.shape[0])
    is_row = rows < num_rows[0]
    query_start_loc = jnp.minimum(jnp.arange(tokens.shape[0] + 1), num_rows[0]).astype(jnp.int32)

    def one_step(carry, j):
        tokens, kv_caches = carry
        position = jnp.minimum(positions + j, max_model_len - 1)
        is_written = is_row & (positions + j < max_model_len)
        block = block_tables[rows, position // block_size]
        metadata = AttentionMetadata(
            slot_mapping=jnp.where(is_written, block * block_size + position % block_size, 0),
            query_start_loc=query_start_loc,
            seq_lens=jnp.where(is_row, position + 1, 0),
            block_tables=block_tables,
            num_seqs=num_rows,
        )
        hidden, kv_caches = model(tokens, jnp.where(is_row, position, 0), kv_caches, [metadata] * len(kv_caches))
        tokens = jnp.argmax(replicate(model.compute_logits(hidden)), axis=-1).astype(jnp.int32)
        return (tokens, kv_caches), tokens

    (_, kv_caches), drafts = jax.lax.scan(one_step, (tokens, kv_caches), jnp.arange(k))
    return kv_caches, drafts.T


def _propose_after_step(layout: StepLayout, static: tuple, param_leaves, kv_caches, packed, prev, sampled):
    """The proposal right after a target step, on the device alone (async scheduling): the
    draft's forward over the step's own tokens (`layout` is the step's), then k one-token
    steps from each row's newest token (the one drawn after its last kept draft); the drafts
    go into the step's sampled array, which is returned with the caches."""
    k, block_size, max_model_len, graphdef, treedef = static
    f = correct_optimistic_fields(layout, layout.unpack(packed), prev)
    input_ids = step_input_ids(f, prev)
    after, last = drafting_inputs(layout, f, input_ids, sampled)
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, param_leaves))
    _, kv_caches = model(
        input_ids, f["positions"], kv_caches, layer_attention_metadata(layout, (0,) * len(kv_caches), f)
    )
    inputs = (after[last], f["positions"][last] + 1, f["block_tables"][0], f["num_seqs"])
    kv_caches, drafts = _decode(k, block_size, max_model_len, graphdef, treedef, param_leaves, kv_caches, inputs)
    return kv_caches, with_drafts(layout, sampled, drafts)


def computed_ends(batch: InputBatch, record: StepRecord, token_lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the step: whether its request still holds its slot, and the end of the
    tokens the target has computed with the request's own values once the step ran (a
    sampling row's newest token, just drawn, is not computed yet)."""
    in_batch = batch.slot_versions[record.rows] == record.slot_versions
    is_sampled = np.fromiter(map(bool, token_lists), bool, len(token_lists))
    return in_batch, np.where(is_sampled, batch.num_tokens[record.rows] - 1, record.seq_lens)


def fill_ragged(
    layouts: dict[int, StepLayout],
    buffers: dict[int, PackedBuffer],
    batch: InputBatch,
    block_size: int,
    rows: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    token_offset: int = 0,
) -> tuple[StepLayout, PackedBuffer]:
    """The smallest bucket's buffer filled with row i's positions [starts[i], starts[i] +
    counts[i]) of slot `rows[i]` (its token at position + `token_offset`), their slots in
    the target's blocks, each row's last token as `logits_indices`."""
    total = int(counts.sum())
    layout = next(layout for t, layout in layouts.items() if total <= t)
    buffer = buffers[layout.num_tokens]
    buffer.reset()
    row_of_token, cu, positions = ragged_positions(starts, counts)
    token_rows = rows[row_of_token]
    table = batch.block_table.block_tables[0]
    values = {
        "input_ids": batch.token_ids_cpu[token_rows, positions + token_offset],
        "positions": positions,
        "query_start_loc": query_start_loc(cu, layout.num_reqs),
        "seq_lens": starts + counts,
        "num_seqs": np.array([len(rows)], np.int32),
        "logits_indices": cu - 1,
    }
    for name, value in values.items():
        buffer.fields[name][: len(value)] = value
    block_ids = table.block_table[token_rows, positions // block_size]
    buffer.fields["slot_mapping"][0, :total] = block_ids * block_size + positions % block_size
    buffer.set_block_tables(table.block_table, rows, int(table.num_blocks_per_row[rows].max()))
    return layout, buffer


class DraftModelProposer:
    """Holds the draft model, its KV cache and its two compiled programs."""

    def __init__(
        self,
        model: nnx.Module,
        kv_caches: list[jax.Array],
        mesh: Mesh,
        layouts: dict[int, StepLayout],
        input_batch: InputBatch,
        block_size: int,
        num_spec_tokens: int,
    ):
        self.graphdef, state = nnx.split(model)
        self.param_leaves, self.treedef = jax.tree.flatten(state)
        self.kv_caches = kv_caches
        self.mesh = mesh
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.batch = input_batch
        self.k = num_spec_tokens
        self.block_size = block_size
        self.max_model_len = input_batch.token_ids_cpu.shape[1]
        self.layouts = {
            t: dataclasses.replace(layout, num_spec_tokens=0, table=STEP_INPUTS, features=PLAIN)
            for t, layout in layouts.items()
        }
        self.target_layouts = layouts
        self.buffers = {t: PackedBuffer(layout) for t, layout in self.layouts.items()}
        self.num_computed = np.zeros(input_batch.max_num_reqs, np.int32)
        """Per slot: the request's tokens whose draft KV is in the cache."""
        self._catch_ups: dict[int, object] = {}
        self._decode = None
        self._after_step_programs: dict[int, object] = {}

    def compile(self) -> None:
        """Both programs, ahead of the first request: catch-up per token bucket, and decode."""
        replicated = self.replicated
        state = (self.param_leaves, self.kv_caches)
        shardings = jax.tree.map(lambda x: x.sharding, state)
        structs = abstract_like(state)
        for t, layout in self.layouts.items():
            fn = jax.jit(
                functools.partial(_catch_up, layout, len(self.kv_caches), self.graphdef, self.treedef),
                in_shardings=(*shardings, replicated),
                out_shardings=shardings[1],
                donate_argnums=(1,),
            )
            packed = jax.ShapeDtypeStruct((layout.size,), jnp.int32, sharding=replicated)
            with jax.set_mesh(self.mesh):
                self._catch_ups[t] = fn.lower(*structs, packed).compile()
        num_rows, width = self.batch.max_num_reqs, self.batch.block_table.block_tables[0].block_table.shape[1]
        inputs = tuple(
            jax.ShapeDtypeStruct(shape, jnp.int32, sharding=replicated)
            for shape in ((num_rows,), (num_rows,), (num_rows, width), (1,))
        )
        fn = jax.jit(
            functools.partial(_decode, self.k, self.block_size, self.max_model_len, self.graphdef, self.treedef),
            in_shardings=(*shardings, replicated),
            out_shardings=(shardings[1], replicated),
            donate_argnums=(1,),
        )
        with jax.set_mesh(self.mesh):
            self._decode = fn.lower(*structs, inputs).compile()

    def compile_after_step(self) -> None:
        """Instead of `compile` (async scheduling): the program that follows each target step bucket."""
        replicated = self.replicated
        state = (self.param_leaves, self.kv_caches)
        shardings = jax.tree.map(lambda x: x.sharding, state)
        static = (self.k, self.block_size, self.max_model_len, self.graphdef, self.treedef)
        for t, layout in self.target_layouts.items():
            fn = jax.jit(
                functools.partial(_propose_after_step, layout, static),
                in_shardings=(*shardings, replicated, replicated, replicated),
                out_shardings=(shardings[1], replicated),
                donate_argnums=(1,),
            )
            packed = jax.ShapeDtypeStruct((layout.size,), jnp.int32, sharding=replicated)
            sampled = jax.ShapeDtypeStruct((layout.sampled_size,), jnp.int32, sharding=replicated)
            with jax.set_mesh(self.mesh):
                self._after_step_programs[t] = fn.lower(*abstract_like(state), packed, sampled, sampled).compile()

    def propose_after_step(self, num_tokens: int, packed: jax.Array, prev_sampled, sampled, target_hidden=None):
        """Right after the target step of bucket `num_tokens` (its packed inputs, the sampled
        array it read and the one it returned), without waiting for it: that array with the
        drafts for each of its rows' next step."""
        with jax.set_mesh(self.mesh):
            self.kv_caches, sampled = self._after_step_programs[num_tokens](
                self.param_leaves, self.kv_caches, packed, prev_sampled, sampled
            )
        return sampled

    def request_entered(self, row: int, num_computed_tokens: int) -> None:
        """A request took slot `row` with that many tokens computed (prefix-cache hits have
        the draft's KV too: every block the target computed, the draft computed)."""
        self.num_computed[row] = num_computed_tokens

    def propose_batch(
        self, record: StepRecord, token_lists: list[list[int]], limits: list[int], target_hidden=None
    ) -> list[list[int]]:
        """Per row of the step, up to `limits[i]` drafts (rows with a limit of 0 get none)."""
        batch = self.batch
        rows = record.rows.astype(np.int64)
        # A sampling row's newest token is the decode steps' first input.
        in_batch, ends = computed_ends(batch, record, token_lists)
        ends = np.where(in_batch, ends, self.num_computed[rows])
        self._run_catch_up(rows, ends)
        self.num_computed[rows] = np.maximum(self.num_computed[rows], ends)
        proposing = [i for i, limit in enumerate(limits) if limit > 0 and in_batch[i]]
        drafts = [[] for _ in token_lists]
        if not proposing:
            return drafts
        proposed = self._run_decode(rows[proposing])
        for n, i in enumerate(proposing):
            drafts[i] = proposed[n, : limits[i]].tolist()
            self.num_computed[rows[i]] = batch.num_tokens[rows[i]]
        return drafts

    def _run_catch_up(self, rows: np.ndarray, ends: np.ndarray) -> None:
        starts = self.num_computed[rows]
        counts = np.maximum(ends - starts, 0)
        rows, starts, counts = rows[counts > 0], starts[counts > 0], counts[counts > 0]
        if not counts.sum():
            return
        # The CPU backend may alias the buffer it was handed: the last program must be done.
        jax.block_until_ready(self.kv_caches)
        layout, buffer = fill_ragged(self.layouts, self.buffers, self.batch, self.block_size, rows, starts, counts)
        with jax.set_mesh(self.mesh):
            self.kv_caches = self._catch_ups[layout.num_tokens](
                self.param_leaves, self.kv_caches, put_replicated(buffer.data, self.replicated)
            )

    def _run_decode(self, rows: np.ndarray) -> np.ndarray:
        batch, num_rows = self.batch, len(rows)
        tokens = np.zeros(batch.max_num_reqs, np.int32)
        positions = np.zeros(batch.max_num_reqs, np.int32)
        positions[:num_rows] = batch.num_tokens[rows] - 1
        tokens[:num_rows] = batch.token_ids_cpu[rows, positions[:num_rows]]
        table = batch.block_table.block_tables[0].block_table
        block_tables = np.zeros_like(table)
        block_tables[:num_rows] = table[rows]
        inputs = tuple(
            put_replicated(a, self.replicated)
            for a in (tokens, positions, block_tables, np.array([num_rows], np.int32))
        )
        with jax.set_mesh(self.mesh):
            self.kv_caches, drafts = self._decode(self.param_leaves, self.kv_caches, inputs)
        return np.asarray(drafts)[:num_rows]
