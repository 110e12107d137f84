"""Every input of a step, declared once: the table the packed buffer, the persistent batch's
columns, the runner's fill loop and the device metadata pytrees are generated from.

Each row says what a field is (name, dtype, doc), its extent (per token, per request row,
per row x k; once per KV cache group or shared), the value of its entries that no token or
row of the step fills, where its value comes from, and which device pytree receives it:

- `RequestColumn(value)`: a column of `InputBatch`, one entry per slot, written from the
  request's state when it enters the batch (`value(state)`); each step copies the scheduled
  rows' entries.
- `STEP`: derived each step by the runner from the scheduler output and the batch.
- `BLOCK_TABLE`: the rows of the persistent block table (the last field of the buffer, so the
  others are reset with one copy; see `PackedBuffer`).

`metadata` routes a field to `AttentionMetadata` (per group when `per_group`), to
`SamplingMetadata` (a subclass generated here, whose table fields join the device-side
fields declared in vjx/sampling/metadata.py), or nowhere (the step reads it itself). A new
per-row sampling field is one `RequestColumn` row with `metadata=SAMPLING`, plus the code
that uses it.

Legend: T tokens (the bucket), R request rows, R1 = R + 1, S sampling positions (R without
speculative decoding), G KV cache groups, W block table width, K min_tokens stop ids per row.
"""

import dataclasses
import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.sampling.metadata import SamplingMetadata
from vjx.sampling_params import MAX_MIN_TOKENS_STOP_IDS, SamplingParams
from vjx.validation import INT32_MAX

if TYPE_CHECKING:
    from vjx.worker.input_batch import CachedRequestState

ATTENTION = "attention"
SAMPLING = "sampling"
_JAXTYPING = {np.int32: Int, np.float32: Float, np.bool_: Bool}


class Per(enum.Enum):
    """A field's leading extent (before its group axis and after it, its width)."""

    TOKEN = "T"
    ROW = "R"
    ROW_BOUNDARY = "R1"
    """One more than the rows: row r's range starts at entry r and ends at entry r + 1."""
    SAMPLE = "S"
    """A sampling position (speculative decoding: a row samples after each of its drafts too)."""
    STEP = "1"


class Source(enum.Enum):
    STEP = "derived each step by the runner"
    BLOCK_TABLE = "the persistent block table's rows"


@dataclasses.dataclass(frozen=True)
class RequestColumn:
    """An `InputBatch` column, written from the request's state when it enters the batch."""

    value: Callable[["CachedRequestState"], Any]


@dataclasses.dataclass(frozen=True)
class Width:
    """A trailing axis: its legend letter, and its size (a number or a layout dimension)."""

    dim: str
    size: int | str


@dataclasses.dataclass(frozen=True)
class StepInput:
    """One row of the table."""

    name: str
    dtype: type
    """np.int32, np.float32 (bit-cast into the int32 buffer) or np.bool_ (travels as 0/1)."""
    per: Per
    source: RequestColumn | Source
    doc: str
    padding: int | float | str = 0
    """Entries no token or row fills; a string names a layout dimension (e.g. "max_num_reqs")."""
    width: Width | None = None
    per_group: bool = False
    """One copy per KV cache group (leading axis G)."""
    metadata: str | None = None
    """ATTENTION, SAMPLING, or None (the step function reads it from the unpacked fields)."""

    def shape(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        shape = (dims[self.per.value],)
        if self.width is not None:
            shape += (self.width.size if isinstance(self.width.size, int) else dims[self.width.size],)
        return ((dims["G"],) if self.per_group else ()) + shape

    @property
    def annotation(self):
        """The jaxtyping type of the field on the device (group axis included)."""
        dims = ("G " if self.per_group else "") + self.per.value
        if self.width is not None:
            dims += " " + self.width.dim
        return _JAXTYPING[self.dtype][Array, dims]


def min_tokens_stop_ids(state: "CachedRequestState") -> list[int]:
    """The tokens a request below its min_tokens may not draw: its stop ids and its EOS."""
    params = state.sampling_params
    stop_ids = list(params.stop_token_ids)
    if state.eos_token_id is not None and not params.ignore_eos:
        stop_ids.append(state.eos_token_id)
    return stop_ids


def bans_stop_ids_in_bias(state: "CachedRequestState") -> bool:
    """Whether the request's stop ids are more than the step's table holds while it is still
    below min_tokens: its logit bias row bans them instead, until it reaches min_tokens."""
    is_below_min_tokens = len(state.output_token_ids) < state.sampling_params.min_tokens
    return is_below_min_tokens and len(min_tokens_stop_ids(state)) > MAX_MIN_TOKENS_STOP_IDS


def has_logit_bias(params: SamplingParams) -> bool:
    return bool(params.logit_bias or params.allowed_token_ids)


def _stop_id_column(state: "CachedRequestState") -> list[int]:
    """The stop ids the table holds: none when they do not fit (see `bans_stop_ids_in_bias`)."""
    stop_ids = min_tokens_stop_ids(state)
    return stop_ids if len(stop_ids) <= MAX_MIN_TOKENS_STOP_IDS else []


def _param(name: str) -> RequestColumn:
    return RequestColumn(lambda state: getattr(state.sampling_params, name))


class StepInputTable:
    """The declared step inputs, and what is generated from them."""

    def __init__(self, inputs: Sequence[StepInput]):
        names = [row.name for row in inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"step input names must be unique, got {names}.")
        tables = [i for i, row in enumerate(inputs) if row.source is Source.BLOCK_TABLE]
        if tables != [len(inputs) - 1]:
            raise ValueError("the block table must be the one BLOCK_TABLE input, and the last.")
        for row in inputs:
            if row.metadata not in (None, ATTENTION, SAMPLING):
                raise ValueError(f"metadata of {row.name!r} must be None, {ATTENTION!r} or {SAMPLING!r}.")
        self.inputs = tuple(inputs)
        self.request_columns = tuple(row for row in inputs if isinstance(row.source, RequestColumn))
        self.step_values = tuple(row for row in inputs if row.source is Source.STEP)
        self._column_names = tuple(row.name for row in self.request_columns)
        self._shared_step_names = tuple(row.name for row in self.step_values if not row.per_group)
        self._per_group_step_names = tuple(row.name for row in self.step_values if row.per_group)
        self._attention = tuple(row for row in inputs if row.metadata == ATTENTION)
        self._sampling = tuple(row for row in inputs if row.metadata == SAMPLING)

    def __getitem__(self, name: str) -> StepInput:
        return next(row for row in self.inputs if row.name == name)

    def with_inputs(self, *inputs: StepInput) -> "StepInputTable":
        """This table with `inputs` added before the block table."""
        return StepInputTable((*self.inputs[:-1], *inputs, self.inputs[-1]))

    @functools.cached_property
    def sampling_metadata_class(self) -> type[SamplingMetadata]:
        """`SamplingMetadata` with a field for each SAMPLING input, as a pytree."""
        fields = [(row.name, row.annotation, dataclasses.field(metadata={"doc": row.doc})) for row in self._sampling]
        cls = dataclasses.make_dataclass(
            "StepSamplingMetadata", fields, bases=(SamplingMetadata,), frozen=True, kw_only=True
        )
        cls.__module__ = __name__
        cls.__doc__ = "The step's sampling metadata: " + ", ".join(row.name for row in self._sampling) + "."
        return jax.tree_util.register_dataclass(cls)

    def attention_metadata(self, fields: Mapping[str, Array], num_groups: int) -> list[AttentionMetadata]:
        """One `AttentionMetadata` per KV cache group."""
        return [
            AttentionMetadata(
                **{row.name: fields[row.name][g] if row.per_group else fields[row.name] for row in self._attention}
            )
            for g in range(num_groups)
        ]

    def sampling_metadata(self, fields: Mapping[str, Array], **device_fields) -> SamplingMetadata:
        """The SAMPLING inputs, with the fields the step computes on the device."""
        return self.sampling_metadata_class(**{row.name: fields[row.name] for row in self._sampling}, **device_fields)

    def fill(
        self,
        views: Mapping[str, np.ndarray],
        columns: Mapping[str, np.ndarray],
        rows: np.ndarray,
        step_values: Mapping[str, np.ndarray],
    ) -> None:
        """The runner's fill loop: each request column's entries of `rows`, then each derived
        value into the leading entries of its field (a per-group value: one array per group);
        the rest keeps its padding."""
        num_rows = len(rows)
        for name in self._column_names:
            views[name][:num_rows] = columns[name][rows]
        for name in self._shared_step_names:
            value = step_values[name]
            views[name][: len(value)] = value
        for name in self._per_group_step_names:
            view = views[name]
            for group, value in enumerate(step_values[name]):
                view[group, : len(value)] = value


STEP_INPUTS = StepInputTable(
    (
        # per token
        StepInput("input_ids", np.int32, Per.TOKEN, Source.STEP, "The token each position runs."),
        StepInput(
            "prev_sampled_index",
            np.int32,
            Per.TOKEN,
            Source.STEP,
            "Index in the previous step's output of a token not on the host yet; -1: the host knows it.",
            padding=-1,
        ),
        StepInput("positions", np.int32, Per.TOKEN, Source.STEP, "Each token's position in its request."),
        StepInput(
            "slot_mapping",
            np.int32,
            Per.TOKEN,
            Source.STEP,
            "Flat cache slot (block_id * block_size + offset) each token's K/V is written to.",
            per_group=True,
            metadata=ATTENTION,
        ),
        StepInput(
            "token_slots",
            np.int32,
            Per.TOKEN,
            Source.STEP,
            "Persistent-batch slot of each token, for the token history (padding: the scratch row).",
            padding="max_num_reqs",
        ),
        StepInput(
            "prompt_logprobs_targets",
            np.int32,
            Per.TOKEN,
            Source.STEP,
            "The next prompt token, where its prompt logprob is asked for; else -1.",
            padding=-1,
        ),
        # per attention row
        StepInput(
            "query_start_loc",
            np.int32,
            Per.ROW_BOUNDARY,
            Source.STEP,
            "Row r's query tokens are [query_start_loc[r], query_start_loc[r + 1]).",
            metadata=ATTENTION,
        ),
        StepInput(
            "seq_lens",
            np.int32,
            Per.ROW,
            Source.STEP,
            "Keys of row r after this step: cached tokens + this step's tokens.",
            metadata=ATTENTION,
        ),
        StepInput("num_seqs", np.int32, Per.STEP, Source.STEP, "Number of real rows.", metadata=ATTENTION),
        # per sampled row (row i is attention row i)
        StepInput("logits_indices", np.int32, Per.ROW, Source.STEP, "The token whose logits each row samples from."),
        StepInput("sample_slots", np.int32, Per.ROW, Source.STEP, "Each row's persistent-batch slot."),
        StepInput(
            "temperature",
            np.float32,
            Per.ROW,
            _param("temperature"),
            "Below 1e-5 (0 in practice) the row is greedy.",
            metadata=SAMPLING,
        ),
        StepInput(
            "top_k",
            np.int32,
            Per.ROW,
            RequestColumn(lambda state: min(state.sampling_params.top_k, INT32_MAX)),
            "Keep the k largest logits (ties at the k-th too); 0, or k >= V, is off.",
            metadata=SAMPLING,
        ),
        StepInput(
            "top_p",
            np.float32,
            Per.ROW,
            _param("top_p"),
            "Keep the fewest most likely tokens with mass >= p; 1 is off.",
            padding=1.0,
            metadata=SAMPLING,
        ),
        StepInput(
            "min_p",
            np.float32,
            Per.ROW,
            _param("min_p"),
            "Keep tokens with probability >= min_p x the row's largest; 0 is off.",
            metadata=SAMPLING,
        ),
        StepInput(
            "presence_penalty",
            np.float32,
            Per.ROW,
            _param("presence_penalty"),
            "In [-2, 2]; subtracted once from every token the output holds.",
            metadata=SAMPLING,
        ),
        StepInput(
            "frequency_penalty",
            np.float32,
            Per.ROW,
            _param("frequency_penalty"),
            "In [-2, 2]; subtracted once per occurrence of a token in the output.",
            metadata=SAMPLING,
        ),
        StepInput(
            "repetition_penalty",
            np.float32,
            Per.ROW,
            _param("repetition_penalty"),
            "> 0; divides positive (multiplies other) logits of tokens in prompt or output.",
            padding=1.0,
            metadata=SAMPLING,
        ),
        StepInput(
            "seeds",
            np.int32,
            Per.ROW,
            RequestColumn(lambda state: state.seed),
            "The request's seed (its own, else one from the engine).",
            metadata=SAMPLING,
        ),
        StepInput(
            "sample_positions",
            np.int32,
            Per.ROW,
            Source.STEP,
            "Output tokens the row already has: its key is fold_in(key(seed), position), so a seeded "
            "request draws the same tokens whatever batch or row it lands in.",
            metadata=SAMPLING,
        ),
        StepInput(
            "num_prompt_tokens",
            np.int32,
            Per.ROW,
            RequestColumn(lambda state: len(state.prompt_token_ids)),
            "Columns [0, num_prompt_tokens) of the row's token history are its prompt.",
            metadata=SAMPLING,
        ),
        StepInput(
            "num_logprobs",
            np.int32,
            Per.ROW,
            RequestColumn(
                lambda state: -1 if state.sampling_params.logprobs is None else state.sampling_params.logprobs
            ),
            "The request's logprobs; -1: none.",
            padding=-1,
        ),
        StepInput(
            "is_below_min_tokens",
            np.bool_,
            Per.ROW,
            Source.STEP,
            "The row has fewer than min_tokens outputs: its stop tokens get -inf.",
            metadata=SAMPLING,
        ),
        StepInput(
            "has_logit_bias",
            np.bool_,
            Per.ROW,
            RequestColumn(lambda state: has_logit_bias(state.sampling_params) or bans_stop_ids_in_bias(state)),
            "The row's logit bias row is not all zero (a bias, allowed tokens, or stop ids banned there).",
            metadata=SAMPLING,
        ),
        StepInput(
            "stop_token_ids",
            np.int32,
            Per.ROW,
            RequestColumn(_stop_id_column),
            "The row's EOS (unless ignore_eos) and stop_token_ids, padded with -1 (none when they do not fit).",
            padding=-1,
            width=Width("K", MAX_MIN_TOKENS_STOP_IDS),
            metadata=SAMPLING,
        ),
        # last, so the fields before it are cleared with one fill (see PackedBuffer)
        StepInput(
            "block_tables",
            np.int32,
            Per.ROW,
            Source.BLOCK_TABLE,
            "Row r's KV blocks, in order; entries past the row's last block are 0.",
            width=Width("W", "max_num_blocks_per_req"),
            per_group=True,
            metadata=ATTENTION,
        ),
    )
)

LORA_INPUTS = (
    StepInput(
        "lora_slots",
        np.int32,
        Per.TOKEN,
        Source.STEP,
        "Each token's LoRA adapter slot on the device; -1: the base model (and padding).",
        padding=-1,
    ),
)
"""With `enable_lora`: the per-token adapter slot every LoRA layer reads (vjx/lora/layers.py)."""
