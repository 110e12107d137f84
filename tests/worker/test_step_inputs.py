"""The step input table: a field added to a copy of it travels host -> packed buffer -> device
metadata intact, with no other change; the real table matches the pytrees it feeds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vjx.attention.metadata import AttentionMetadata
from vjx.sampling.metadata import SamplingMetadata
from vjx.sampling_params import SamplingParams
from vjx.worker.input_batch import CachedRequestState, InputBatch
from vjx.worker.step_inputs import ATTENTION, SAMPLING, STEP_INPUTS, Per, RequestColumn, Source, StepInput, Width
from vjx.worker.step_layout import PackedBuffer, StepLayout

NUM_SLOTS, MAX_MODEL_LEN, WIDTH, NUM_GROUPS = 4, 32, 3, 2
# Two new fields: a per-row sampling field from each request's state, with a padding of its
# own, and a per-row x k field the runner derives each step.
TYPICAL_P = StepInput(
    "typical_p",
    np.float32,
    Per.ROW,
    RequestColumn(lambda state: state.seed / 100),
    "A made-up sampling parameter.",
    padding=1.0,
    metadata=SAMPLING,
)
DRAFTS = StepInput(
    "draft_token_ids", np.int32, Per.ROW, Source.STEP, "Made-up draft tokens.", padding=-1, width=Width("D", 2)
)
TABLE = STEP_INPUTS.with_inputs(TYPICAL_P, DRAFTS)


def _state(req_id: str, seed: int, block_ids) -> CachedRequestState:
    return CachedRequestState(req_id, [5, 6, 7], SamplingParams(temperature=0.5), seed=seed, block_ids=block_ids)


def _device_fields(layout: StepLayout):
    sampling_rows = layout.num_reqs
    return dict(
        token_ids=jnp.zeros((sampling_rows, 1), jnp.int32),
        num_tokens=jnp.zeros(sampling_rows, jnp.int32),
        logit_bias=jnp.zeros((sampling_rows, 8), jnp.float32),
        logit_bias_rows=jnp.zeros(sampling_rows, jnp.int32),
        bad_words=jnp.full((sampling_rows, 1, 1), -1, jnp.int32),
        grammar_bans=jnp.zeros((sampling_rows, 1), jnp.int32),
    )


def test_a_new_field_travels_from_the_host_to_the_device_metadata():
    batch = InputBatch(NUM_SLOTS, MAX_MODEL_LEN, WIDTH, NUM_GROUPS, table=TABLE)
    for req_id, seed, blocks in (("a", 7, ([1, 2], [3])), ("b", 30, ([4], [5, 6])), ("c", 64, ([7], [8]))):
        batch.add_request(_state(req_id, seed, blocks), 0)
    np.testing.assert_array_equal(batch.columns["typical_p"], np.float32([0.07, 0.3, 0.64, 1.0]))  # slot 3: padding
    rows = np.array([2, 0])  # "c" then "a"
    layout = StepLayout(16, NUM_SLOTS, NUM_SLOTS, WIDTH, 2, NUM_GROUPS, table=TABLE)
    buffer = PackedBuffer(layout)
    buffer.reset()
    # Only the new field has entries this step; the others keep their padding.
    step_values = {row.name: np.zeros((0,) * len(layout.shapes[row.name]), np.int32) for row in TABLE.step_values}
    step_values["draft_token_ids"] = np.array([[9, 10], [11, 12]])
    TABLE.fill(buffer.fields, batch.columns, rows, step_values)
    for group, table in enumerate(batch.block_table.block_tables):
        buffer.set_block_tables(table.block_table, rows, 2, group)

    @jax.jit
    def to_metadata(packed):
        fields = layout.unpack(packed)
        return (
            fields["draft_token_ids"],
            TABLE.sampling_metadata(fields, **_device_fields(layout)),
            TABLE.attention_metadata(fields, NUM_GROUPS),
        )

    drafts, sampling, attention = to_metadata(jnp.asarray(buffer.data))
    np.testing.assert_array_equal(drafts, [[9, 10], [11, 12], [-1, -1], [-1, -1]])
    np.testing.assert_allclose(sampling.typical_p, [0.64, 0.07, 1.0, 1.0])
    np.testing.assert_allclose(sampling.temperature, [0.5, 0.5, 0.0, 0.0])
    assert isinstance(sampling, SamplingMetadata) and sampling.typical_p.dtype == jnp.float32
    np.testing.assert_array_equal(attention[0].block_tables[:3], [[7, 0, 0], [1, 2, 0], [0, 0, 0]])
    np.testing.assert_array_equal(attention[1].block_tables[:3], [[8, 0, 0], [3, 0, 0], [0, 0, 0]])


def test_the_table_feeds_every_metadata_field():
    attention_rows = {row.name for row in STEP_INPUTS.inputs if row.metadata == ATTENTION}
    assert attention_rows == {f.name for f in dataclasses.fields(AttentionMetadata)}
    sampling_rows = {row.name for row in STEP_INPUTS.inputs if row.metadata == SAMPLING}
    generated = {f.name for f in dataclasses.fields(STEP_INPUTS.sampling_metadata_class)}
    assert generated == sampling_rows | {f.name for f in dataclasses.fields(SamplingMetadata)}
    assert STEP_INPUTS.inputs[-1].source is Source.BLOCK_TABLE
