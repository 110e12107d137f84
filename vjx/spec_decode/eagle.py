"""The EAGLE proposer: a draft head on the target's hidden states (EAGLE-1,
vjx/models/llama_eagle.py), proposing its greedy tokens on the device.

The head's KV cache takes the target's blocks, as a draft model's does. Its position p holds
the pair (token at p + 1, the target's hidden state at p), so after each target step one
program runs, per row of the step:

1. catch-up over the step's positions whose hidden states are the request's (a prompt chunk,
   or the last token and the accepted drafts), each with the token after it, the newest
   token (the one the step drew) last: the head's output at the last position is draft 1;
2. k - 1 one-token steps, each from the last draft and the head's own last hidden state.

The target step returns its tokens' hidden states for this (`returns_hidden_states`); they
stay on the device. As for a draft model, the scheduler allocates k slots ahead, and a
proposal only changes how many drafts are accepted, never which tokens the request gets.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vjx.attention.metadata import AttentionMetadata
from vjx.sharding.placement import abstract_like, put_replicated
from vjx.spec_decode.async_drafts import correct_optimistic_fields, drafting_inputs, with_drafts
from vjx.spec_decode.draft_model import computed_ends, fill_ragged
from vjx.worker.input_batch import InputBatch
from vjx.worker.step import layer_attention_metadata, step_input_ids
from vjx.worker.step_inputs import STEP_INPUTS, Per, Source, StepInput
from vjx.worker.step_layout import PLAIN, PackedBuffer, StepLayout
from vjx.worker.step_outputs import StepRecord

EAGLE_INPUTS = (
    StepInput(
        "target_hidden_index",
        np.int32,
        Per.TOKEN,
        Source.STEP,
        "Where the target step's hidden state of the token's position is, among that step's tokens.",
    ),
)


@dataclasses.dataclass(frozen=True)
class _Programs:
    """What the propose program closes over (static)."""

    layout: StepLayout
    k: int
    block_size: int
    max_model_len: int
    head: tuple
    target: tuple


def _merge(static: _Programs, head_leaves, target_leaves):
    head = nnx.merge(static.head[0], jax.tree.unflatten(static.head[1], head_leaves))
    return head, nnx.merge(static.target[0], jax.tree.unflatten(static.target[1], target_leaves))


def _propose(static: _Programs, head_leaves, target_leaves, kv_caches, target_hidden, packed):
    """Catch-up, then k - 1 one-token steps; returns the caches and the drafts [R, k]."""
    layout, num_layers = static.layout, len(kv_caches)
    f = layout.unpack(packed)
    head, target = _merge(static, head_leaves, target_leaves)
    metadata = layer_attention_metadata(layout, (0,) * num_layers, f)
    embeds = target.model.embed(f["input_ids"])
    hidden = head.combine_hidden_states(target_hidden[f["target_hidden_index"]])
    hidden, kv_caches = head(embeds, hidden, f["positions"], kv_caches, metadata)
    return _head_steps(static, head, target, kv_caches, hidden[f["logits_indices"]], f["seq_lens"], f)


def _propose_after_step(static: _Programs, head_leaves, target_leaves, kv_caches, target_hidden, packed, prev, sampled):
    """The proposal right after a target step, on the device alone (async scheduling): the
    catch-up runs over the step's own tokens (`static.layout` is the step's), each paired
    with the token after it; the drafts go into the step's sampled array, which is returned
    with the caches."""
    layout, num_layers = static.layout, len(kv_caches)
    f = correct_optimistic_fields(layout, layout.unpack(packed), prev)
    after, last = drafting_inputs(layout, f, step_input_ids(f, prev), sampled)
    head, target = _merge(static, head_leaves, target_leaves)
    metadata = layer_attention_metadata(layout, (0,) * num_layers, f)
    hidden = head.combine_hidden_states(target_hidden)
    hidden, kv_caches = head(target.model.embed(after), hidden, f["positions"], kv_caches, metadata)
    kv_caches, drafts = _head_steps(static, head, target, kv_caches, hidden[last], f["positions"][last] + 1, f)
    return kv_caches, with_drafts(layout, sampled, drafts)


def _head_steps(static: _Programs, head, target, kv_caches, hidden, next_positions, f):
    """Draft 1 from each row's `hidden`, then k - 1 one-token steps at `next_positions` + j,
    each from the last draft and the head's last state; returns the caches and the drafts."""
    layout, num_layers = static.layout, len(kv_caches)
    tokens = head.draft_tokens(target, hidden)
    rows = jnp.arange(layout.num_reqs)
    is_row = rows < f["num_seqs"][0]
    block_tables = f["block_tables"][0]

    def one_step(carry, j):
        tokens, hidden, kv_caches = carry
        position = jnp.minimum(next_positions + j, static.max_model_len - 1)
        is_written = is_row & (next_positions + j < static.max_model_len)
        block = block_tables[rows, position // static.block_size]
        md = AttentionMetadata(
            slot_mapping=jnp.where(is_written, block * static.block_size + position % static.block_size, 0),
            query_start_loc=jnp.minimum(jnp.arange(layout.num_reqs + 1), f["num_seqs"][0]).astype(jnp.int32),
            seq_lens=jnp.where(is_row, position + 1, 0),
            block_tables=block_tables,
            num_seqs=f["num_seqs"],
        )
        step_positions = jnp.where(is_row, position, 0)
        hidden, kv_caches = head(target.model.embed(tokens), hidden, step_positions, kv_caches, [md] * num_layers)
        tokens = head.draft_tokens(target, hidden)
        return (tokens, hidden, kv_caches), tokens

    (_, _, kv_caches), drafts = jax.lax.scan(one_step, (tokens, hidden, kv_caches), jnp.arange(static.k - 1))
    return kv_caches, jnp.concatenate([tokens[:, None], drafts.T], axis=1)


class EagleProposer:
    """Holds the head, its KV cache and its program per token bucket."""

    def __init__(
        self,
        head: nnx.Module,
        kv_caches: list[jax.Array],
        target: tuple,
        mesh: Mesh,
        layouts: dict[int, StepLayout],
        input_batch: InputBatch,
        block_size: int,
        num_spec_tokens: int,
        hidden_dtype,
    ):
        """`target`: the target's (graphdef, treedef, a getter of its param leaves, which waking
        from sleep replaces), for its embedding and LM head; `hidden_dtype`: its hidden
        states' (the model dtype)."""
        self.hidden_shape = (head.target_hidden_size, jnp.dtype(hidden_dtype))
        head_graphdef, state = nnx.split(head)
        self.head_leaves, head_treedef = jax.tree.flatten(state)
        self.head = (head_graphdef, head_treedef)
        self.target = target[:2]
        self.target_leaves = target[2]
        """Returns the target's current param leaves."""
        self.kv_caches = kv_caches
        self.mesh = mesh
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.batch = input_batch
        self.block_size = block_size
        self.k = num_spec_tokens
        self.max_model_len = input_batch.token_ids_cpu.shape[1]
        table = STEP_INPUTS.with_inputs(*EAGLE_INPUTS)
        self.layouts = {
            t: dataclasses.replace(
                layout,
                num_spec_tokens=0,
                table=table,
                features=PLAIN,
                returns_hidden_states=False,
                aux_hidden_state_layers=(),
            )
            for t, layout in layouts.items()
        }
        self.target_layouts = layouts
        self.target_num_tokens = {t: layout.num_tokens for t, layout in layouts.items()}
        self.buffers = {t: PackedBuffer(layout) for t, layout in self.layouts.items()}
        self._programs: dict[tuple[int, int], object] = {}
        self._after_step_programs: dict[int, object] = {}

    def request_entered(self, row: int, num_computed_tokens: int) -> None:
        """The head's catch-up follows the target's steps: it keeps no count of its own."""

    def compile(self) -> None:
        """The program for every (catch-up bucket, target step bucket) pair."""
        replicated = self.replicated
        state = (self.head_leaves, self.target_leaves(), self.kv_caches)
        shardings = jax.tree.map(lambda x: x.sharding, state)
        structs = abstract_like(state)
        hidden_size, hidden_dtype = self.hidden_shape
        for t, layout in self.layouts.items():
            static = _Programs(layout, self.k, self.block_size, self.max_model_len, self.head, self.target)
            fn = jax.jit(
                functools.partial(_propose, static),
                in_shardings=(*shardings, replicated, replicated),
                out_shardings=(shardings[2], replicated),
                donate_argnums=(2,),
            )
            packed = jax.ShapeDtypeStruct((layout.size,), jnp.int32, sharding=replicated)
            for target_tokens in self.target_num_tokens.values():
                hidden = jax.ShapeDtypeStruct((target_tokens, hidden_size), hidden_dtype, sharding=replicated)
                if target_tokens >= t:
                    with jax.set_mesh(self.mesh):
                        self._programs[t, target_tokens] = fn.lower(*structs, hidden, packed).compile()

    def compile_after_step(self) -> None:
        """Instead of `compile` (async scheduling): the program that follows each target step bucket."""
        replicated = self.replicated
        state = (self.head_leaves, self.target_leaves(), self.kv_caches)
        shardings = jax.tree.map(lambda x: x.sharding, state)
        structs = abstract_like(state)
        hidden_size, hidden_dtype = self.hidden_shape
        for t, layout in self.target_layouts.items():
            static = _Programs(layout, self.k, self.block_size, self.max_model_len, self.head, self.target)
            fn = jax.jit(
                functools.partial(_propose_after_step, static),
                in_shardings=(*shardings, replicated, replicated, replicated, replicated),
                out_shardings=(shardings[2], replicated),
                donate_argnums=(2,),
            )
            packed = jax.ShapeDtypeStruct((layout.size,), jnp.int32, sharding=replicated)
            sampled = jax.ShapeDtypeStruct((layout.sampled_size,), jnp.int32, sharding=replicated)
            hidden = jax.ShapeDtypeStruct((t, hidden_size), hidden_dtype, sharding=replicated)
            with jax.set_mesh(self.mesh):
                self._after_step_programs[t] = fn.lower(*structs, hidden, packed, sampled, sampled).compile()

    def propose_after_step(self, num_tokens: int, packed: jax.Array, prev_sampled, sampled, target_hidden) -> jax.Array:
        """Right after the target step of bucket `num_tokens` (its packed inputs, the sampled
        array it read and the one it returned), without waiting for it: that array with the
        drafts for each of its rows' next step."""
        with jax.set_mesh(self.mesh):
            self.kv_caches, sampled = self._after_step_programs[num_tokens](
                self.head_leaves, self.target_leaves(), self.kv_caches, target_hidden, packed, prev_sampled, sampled
            )
        return sampled

    def propose_batch(
        self, record: StepRecord, token_lists: list[list[int]], limits: list[int], target_hidden=None
    ) -> list[list[int]]:
        """Per row of the step, up to `limits[i]` drafts (rows with a limit of 0 get none)."""
        batch = self.batch
        num_tokens = np.bincount(record.token_rows, minlength=len(record.rows))
        starts = record.seq_lens - num_tokens
        # A sampling row: its last token and accepted drafts, each with the token after it.
        in_batch, ends = computed_ends(batch, record, token_lists)
        counts = np.where(in_batch, np.maximum(ends - starts, 0), 0)
        drafts = [[] for _ in token_lists]
        keep = np.flatnonzero(counts > 0)
        if not len(keep):
            return drafts
        rows = record.rows[keep].astype(np.int64)
        jax.block_until_ready(self.kv_caches)
        layout, buffer = fill_ragged(
            self.layouts, self.buffers, batch, self.block_size, rows, starts[keep], counts[keep], token_offset=1
        )
        # Row i's step tokens start after the tokens of the rows before it.
        offsets = (np.cumsum(num_tokens) - num_tokens)[keep]
        index = np.repeat(offsets - starts[keep], counts[keep]) + buffer.fields["positions"][: counts.sum()]
        buffer.fields["target_hidden_index"][: len(index)] = index
        program = self._programs[layout.num_tokens, target_hidden.shape[0]]
        with jax.set_mesh(self.mesh):
            self.kv_caches, proposed = program(
                self.head_leaves,
                self.target_leaves(),
                self.kv_caches,
                target_hidden,
                put_replicated(buffer.data, self.replicated),
            )
        proposed = np.asarray(proposed)
        for n, i in enumerate(keep.tolist()):
            drafts[i] = proposed[n, : limits[i]].tolist() if limits[i] > 0 else []
        return drafts
