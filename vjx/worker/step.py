"""The jitted model step and its AOT compilation.

One step is `(param_leaves, kv_caches, history, slot_tables, prev_sampled, packed,
grammar_bans) ->
(kv_caches, history, sampled, logprobs, prompt_logprobs)`. `kv_caches` and `history` (every slot's tokens so far,
for penalties) are donated, so they are updated in place. `prev_sampled` is the previous
step's output, still on the device: with async scheduling a step is planned before its
predecessor's tokens reach the host, and the tokens it needs are read from there
(`prev_sampled_index`, -1 for tokens the host knows). The packed buffer's fields are the
step input table's (step_inputs.py).

Legend: R rows, T tokens, D hidden, V vocab, K1 = max_logprobs + 1, N history rows (one per
slot; a padding token's slot N writes nowhere), L max_model_len, MS the sampled array's length
(`StepLayout.sampled_size`: max_num_reqs without speculative decoding), S the step's sampling
positions, P the packed
buffer's length, M = ceil(V / 32) words of a row's grammar bans (all zeros: no grammar).
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float, Int

from vjx.sampling.logprobs import compute_logprobs
from vjx.sampling.metadata import SamplingMetadata
from vjx.sampling.sampler import sample
from vjx.sharding.constraints import replicate
from vjx.sharding.placement import abstract_like
from vjx.spec_decode.async_drafts import correct_optimistic_fields
from vjx.spec_decode.sample_positions import num_rejected_drafts, sample_positions_metadata
from vjx.worker.step_layout import StepLayout, compiler_options

# Prompt logprobs need the logits of every token: computed this many tokens at a time.
_PROMPT_LOGITS_CHUNK = 256


def _sampling_metadata(
    layout: StepLayout,
    f: dict[str, Array],
    history: Int[Array, "N L"],
    slot_tables: tuple[Array, Array],
    grammar_bans: Int[Array, "R M"],
) -> SamplingMetadata:
    """The table's sampling fields, and those computed here. Sampled row i is attention row i
    (rows are in the same order); padding rows have no tokens, so no penalty touches them.
    The history is gathered only when some row needs it; the bias table goes to the sampler
    whole and is read there only for rows with a bias."""
    rs = layout.num_reqs
    slot_bias, slot_bad_words = slot_tables
    num_tokens = jnp.where(jnp.arange(rs) < f["num_seqs"][0], f["seq_lens"][:rs], 0)
    bad_words = slot_bad_words[f["sample_slots"]]
    # Penalties count the history; a bad word of several tokens matches its end.
    needs_history = jnp.any(
        (f["presence_penalty"] != 0) | (f["frequency_penalty"] != 0) | (f["repetition_penalty"] != 1)
    ) | jnp.any(bad_words[:, :, :-1] >= 0)
    no_history = jnp.zeros((rs, history.shape[1]), jnp.int32)
    token_ids = no_history
    if layout.features.may_process:
        token_ids = jax.lax.cond(needs_history, lambda: history[f["sample_slots"]], lambda: no_history)
    return layout.table.sampling_metadata(
        f,
        token_ids=token_ids,
        num_tokens=num_tokens,
        logit_bias=slot_bias,
        logit_bias_rows=f["sample_slots"],
        bad_words=bad_words,
        grammar_bans=grammar_bans,
        may_filter=layout.features.may_filter,
        may_process=layout.features.may_process,
    )


Logprobs = tuple[Int[Array, "R K1"], Float[Array, "R K1"], Int[Array, " R"]]
"""Per row: the top ids (the sampled or target token first), their logprobs, its rank."""


def _empty_logprobs(num_rows: int, k: int) -> Logprobs:
    return (
        jnp.zeros((num_rows, k + 1), jnp.int32),
        jnp.zeros((num_rows, k + 1), jnp.float32),
        jnp.zeros((num_rows,), jnp.int32),
    )


def _sample_logprobs(
    layout: StepLayout, logits: Float[Array, "S V"], sampled: Int[Array, " S"], num_logprobs: Int[Array, " S"]
) -> Logprobs:
    """Logprobs of the raw logits for the sampled tokens, when some row asked for them."""
    if not layout.features.has_logprobs:
        return _empty_logprobs(layout.num_samples, layout.max_logprobs)
    return jax.lax.cond(
        jnp.any(num_logprobs >= 0),
        lambda: compute_logprobs(logits, sampled, layout.max_logprobs),
        lambda: _empty_logprobs(layout.num_samples, layout.max_logprobs),
    )


def _prompt_logprobs(layout: StepLayout, model, hidden: Float[Array, "T D"], targets: Int[Array, " T"]):
    """Logprobs of each next prompt token, computed chunk by chunk over all T tokens."""
    num_tokens, k = layout.num_tokens, layout.max_logprobs
    if not layout.features.has_prompt_logprobs:
        return _empty_logprobs(num_tokens, k)
    chunk = min(num_tokens & -num_tokens, _PROMPT_LOGITS_CHUNK)

    def one_chunk(args):
        hidden_c, targets_c = args
        return compute_logprobs(_logits(model, hidden_c), jnp.maximum(targets_c, 0), k)

    def compute():
        parts = (hidden.reshape(num_tokens // chunk, chunk, -1), targets.reshape(num_tokens // chunk, chunk))
        ids, lps, ranks = jax.lax.map(one_chunk, parts)
        return ids.reshape(num_tokens, k + 1), lps.reshape(num_tokens, k + 1), ranks.reshape(num_tokens)

    return jax.lax.cond(jnp.any(targets >= 0), compute, lambda: _empty_logprobs(num_tokens, k))


def _logits(model, hidden: Float[Array, "R D"]) -> Float[Array, "R V"]:
    """Whole logits rows on every device: the vocab-parallel LM head's shards are gathered,
    so sampling and logprobs see the full vocabulary and every device draws the same token."""
    return replicate(model.compute_logits(hidden))


def model_step(
    layout: StepLayout,
    layer_group_ids: tuple[int, ...],
    graphdef,
    treedef,
    param_leaves: list[Array],
    kv_caches: list[Array],
    history: Int[Array, "N L"],
    slot_tables: tuple[Array, Array],
    prev_sampled: Int[Array, " MS"],
    packed: Int[Array, " P"],
    grammar_bans: Int[Array, "R M"],
):
    """Forward the step's tokens, write their KV, and sample one token per row (with
    `layout.returns_hidden_states`, the tokens' final hidden states come out last, or with
    `layout.aux_hidden_state_layers` the residual streams entering those layers, concatenated).

    Layer i attends with its KV cache group's metadata (`layer_group_ids[i]`). The sampled ids
    are padded to MS = max_num_samples entries, so every variant returns (and takes back as
    `prev_sampled`) the same shape.
    """
    f = layout.unpack(packed)
    if layout.num_spec_tokens:
        f = correct_optimistic_fields(layout, f, prev_sampled)
    input_ids = step_input_ids(f, prev_sampled)
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, param_leaves))
    if "lora_slots" in f:
        model.lora_context.token_slots.set_value(f["lora_slots"])
    attn_metadata = layer_attention_metadata(layout, layer_group_ids, f)
    if layout.aux_hidden_state_layers:
        hidden, kv_caches, returned = model.forward_with_aux_hidden_states(
            input_ids, f["positions"], kv_caches, attn_metadata, layout.aux_hidden_state_layers
        )
    else:
        hidden, kv_caches = model(input_ids, f["positions"], kv_caches, attn_metadata)
        returned = hidden
    outputs = (kv_caches, *sample_step(layout, model, f, hidden, input_ids, history, slot_tables, grammar_bans))
    return (*outputs, returned) if layout.returns_hidden_states else outputs


def step_input_ids(f: dict[str, Array], prev_sampled: Int[Array, " MS"]) -> Int[Array, " T"]:
    """The step's token ids: the packed ones, or the previous step's samples still on the device."""
    prev_index = f["prev_sampled_index"]
    return jnp.where(prev_index >= 0, prev_sampled[jnp.maximum(prev_index, 0)], f["input_ids"])


def layer_attention_metadata(layout: StepLayout, layer_group_ids: tuple[int, ...], f: dict[str, Array]) -> list:
    """Each layer's attention metadata: its KV cache group's."""
    group_metadata = layout.table.attention_metadata(f, layout.num_kv_cache_groups)
    return [group_metadata[g] for g in layer_group_ids]


def sample_step(layout: StepLayout, model, f, hidden, input_ids, history, slot_tables, grammar_bans):
    """After the last layer: the history gets the step's tokens, then the final norm's hidden
    states become logits, one sampled token per row (with drafts, per sampling position;
    padded to `max_num_samples`, then with drafts each row's rejected drafts: `sampled_size`)
    and the logprobs. Returns (history, sampled, logprobs,
    prompt_logprobs)."""
    history = history.at[f["token_slots"], f["positions"]].set(input_ids, mode="drop")
    logits_indices, num_logprobs = f["logits_indices"], f["num_logprobs"]
    if layout.num_spec_tokens:
        # The grammar bans come a row per sampling position already.
        no_bans = jnp.zeros((layout.num_reqs, grammar_bans.shape[1]), jnp.int32)
        md = sample_positions_metadata(_sampling_metadata(layout, f, history, slot_tables, no_bans), f, grammar_bans)
        logits_indices, num_logprobs = f["spec_logits_indices"], num_logprobs[f["spec_sample_rows"]]
    else:
        md = _sampling_metadata(layout, f, history, slot_tables, grammar_bans)
    logits = _logits(model, hidden[logits_indices])
    sampled = sample(logits, md)
    logprobs = _sample_logprobs(layout, logits, sampled, num_logprobs)
    prompt_logprobs = _prompt_logprobs(layout, model, hidden, f["prompt_logprobs_targets"])
    padded = jnp.pad(sampled, (0, layout.max_num_samples - layout.num_samples))
    if layout.num_spec_tokens:
        no_drafts = jnp.zeros((layout.max_num_reqs * layout.num_spec_tokens,), jnp.int32)
        padded = jnp.concatenate([padded, num_rejected_drafts(layout, f, sampled, input_ids), no_drafts])
    return history, padded, logprobs, prompt_logprobs


def compile_step(
    layout: StepLayout,
    layer_group_ids: tuple[int, ...],
    graphdef,
    treedef,
    param_leaves,
    kv_caches,
    history,
    slot_tables,
    mesh: Mesh,
):
    """AOT-compiles the step for one layout on `mesh`; the result is called with real arrays.

    Params and KV caches keep the shardings they were placed with (the cache goes out as it
    came in, so donation updates it in place); every other input and output is replicated.
    The trace runs under `jax.set_mesh(mesh)`, which the model's activation constraints and
    the attention `shard_map` read.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    state = (param_leaves, kv_caches, history, slot_tables)
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    fn = jax.jit(
        functools.partial(model_step, layout, layer_group_ids, graphdef, treedef),
        in_shardings=(*state_shardings, replicated, replicated, replicated),
        out_shardings=(state_shardings[1], state_shardings[2], replicated, replicated, replicated)
        + ((replicated,) if layout.returns_hidden_states else ()),
        donate_argnums=(1, 2),
    )
    structs = abstract_like(state)
    prev_sampled = jax.ShapeDtypeStruct((layout.sampled_size,), jnp.int32, sharding=replicated)
    packed = jax.ShapeDtypeStruct((layout.size,), jnp.int32, sharding=replicated)
    grammar_bans = jax.ShapeDtypeStruct((layout.num_samples, layout.num_bitmask_words), jnp.int32, sharding=replicated)
    options = compiler_options(mesh.devices.flat[0].platform, layout.num_tokens)
    with jax.set_mesh(mesh):
        return fn.lower(*structs, prev_sampled, packed, grammar_bans).compile(compiler_options=options)
