"""ModelRunner: applies the scheduler's diff to the persistent batch and runs one step.

Per step: update request state from the `SchedulerOutput`, order the scheduled rows
decode-first, fill the bucket's packed int32 buffer, move it with one transfer, dispatch the
AOT-compiled step, and hand the sampled tokens back as a `ModelRunnerOutput`.

Dispatch does not wait for the device: `execute_model(..., non_block=True)` returns an
`AsyncModelRunnerOutput` at once, so the engine can plan and dispatch the next step while this
one runs (async scheduling). A token the next step needs before it reaches the host is read
on the device from this step's output.
"""

import concurrent.futures
import dataclasses
import logging
import os
import time
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vjx.config import VjxConfig
from vjx.core.sched.output import CachedRequestData, SchedulerOutput
from vjx.kv_cache_interface import KVCacheConfig
from vjx.lora.worker_manager import LoRAManager
from vjx.models.loader import DTYPES
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vjx.sharding.pipeline import stage_layer_ranges
from vjx.sharding.placement import filled, put_replicated
from vjx.spec_decode.async_drafts import draft_index
from vjx.spec_decode.config import EAGLE_METHODS
from vjx.spec_decode.draft_model import DraftModelProposer
from vjx.spec_decode.eagle import EagleProposer
from vjx.spec_decode.ngram_proposer import NgramProposer
from vjx.spec_decode.sample_positions import accepted_tokens, sample_positions
from vjx.worker.compile_watch import CompileWatch
from vjx.worker.input_batch import CachedRequestState, InputBatch
from vjx.worker.pipeline_step import PipelinePlan, compile_pipeline_step, make_pipeline_plan
from vjx.worker.runner_layouts import make_buffers, make_layouts
from vjx.worker.slot_tables import SlotTables
from vjx.worker.step import compile_step
from vjx.worker.step_inputs import has_logit_bias, min_tokens_stop_ids
from vjx.worker.step_layout import (
    GENERAL,
    PLAIN,
    PackedBuffer,
    StepFeatures,
    StepLayout,
    query_start_loc,
    ragged_positions,
    step_variants,
)
from vjx.worker.step_outputs import StepRecord, collect_logprobs

logger = logging.getLogger(__name__)

_SEED_MASK = 0x7FFFFFFF
_NO_TARGETS = np.zeros(0, np.int32)


class ModelRunner:
    """Owns the persistent batch, the KV cache arrays and the compiled step variants.

    Everything the step reads besides params and KV cache (token history, sampling tables,
    the packed inputs, the previous step's tokens) is replicated over `mesh`.
    """

    def __init__(
        self,
        config: VjxConfig,
        model: nnx.Module,
        kv_caches: dict[str, jax.Array],
        mesh: Mesh,
        kv_cache_config: KVCacheConfig,
        stage_meshes: Sequence[Mesh] = (),
        draft: tuple[nnx.Module, list[jax.Array]] | None = None,
    ):
        """`kv_caches`: one array per layer name, in model order, in the attention backend's
        layout, on `mesh`; `kv_cache_config` groups the layers, each group with its own block
        table. With several `stage_meshes` (pipeline stages) the params and each layer's cache
        are on their stage's mesh, and `mesh` is the last stage's. `draft`: speculative
        decoding's draft model and its KV caches (the target's blocks)."""
        sched = config.scheduler_config
        self.mesh = mesh
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.block_size = kv_cache_config.block_size
        self.max_num_reqs = sched.max_num_seqs
        max_blocks = -(-sched.max_model_len // self.block_size)
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.layer_group_ids = kv_cache_config.layer_group_ids(kv_caches)
        self.input_batch = InputBatch(self.max_num_reqs, sched.max_model_len, max_blocks, self.num_kv_cache_groups)
        self.requests: dict[str, CachedRequestState] = {}
        self.kv_caches = list(kv_caches.values())
        self.history = filled((self.max_num_reqs, sched.max_model_len), np.int32, 0, self.replicated)
        self.slot_tables = SlotTables(self.max_num_reqs, config.model_config.hf_text_config.vocab_size, self.replicated)
        self.graphdef, state = nnx.split(model)
        self.param_leaves, self.treedef = jax.tree.flatten(state)
        self.plan = self._plan_pipeline(model, state, stage_meshes)
        self.max_model_len = sched.max_model_len
        self.num_spec_tokens = config.num_speculative_tokens
        self.drafts_on_device = self.num_spec_tokens > 0 and sched.async_scheduling
        """Async scheduling: drafts are proposed after each step, kept on the device (async_drafts.py)."""
        self.lora = None if config.lora_config is None else LoRAManager(model, config.lora_config, self._loras_in_use)
        platform = mesh.devices.flat[0].platform
        self.step_variants = step_variants(platform)
        self.layouts = make_layouts(config, max_blocks, self.num_kv_cache_groups, self.block_size, platform)
        self.drafter = self._make_drafter(config, draft)
        self._no_grammar: dict[int, jax.Array] = {}
        """Per sampling-position count, grammar bans of all zeros on the device (no row constrained)."""
        self._num_buffers, self._packed = make_buffers(config, self.layouts)
        self._num_steps = 0
        self._compiled = {}
        self._seed_rng = np.random.default_rng(config.model_config.seed)
        self._any_layout = any_layout = next(iter(self.layouts.values()))
        self._max_num_samples = any_layout.max_num_samples
        self._last_sampled = self._no_last_sampled = filled((any_layout.sampled_size,), np.int32, 0, self.replicated)
        self._sample_index_by_slot = np.full(self.max_num_reqs, -1, np.int32)
        """Per slot, the index in the last dispatched step's output of the token it samples
        for the slot's request (-1: none); with drafts, the one after its last draft."""
        self._prev_row_by_slot = np.full(self.max_num_reqs, -1, np.int32)
        """Per slot, its row in the last dispatched step (drafts on the device)."""
        self.compile_watch = CompileWatch()
        self._failed_req_ids: set[str] = set()
        """Requests that failed to enter the batch, until the scheduler reports them finished."""

    def _make_drafter(
        self, config: VjxConfig, draft: tuple | None
    ) -> NgramProposer | DraftModelProposer | EagleProposer | None:
        """The speculative config's proposer; `draft` is the draft model and its KV caches."""
        if not self.num_spec_tokens:
            return None
        if config.speculative_config.method == "ngram":
            return NgramProposer(config.speculative_config, self.input_batch)
        if draft is None:
            return None  # a runner built only to size the step's memory
        model, kv_caches = draft
        if config.speculative_config.method in EAGLE_METHODS:
            target = (self.graphdef, self.treedef, lambda: self.param_leaves)
            hidden_dtype = DTYPES[config.model_config.dtype]
            return EagleProposer(
                model,
                kv_caches,
                target,
                self.mesh,
                self.layouts,
                self.input_batch,
                self.block_size,
                self.num_spec_tokens,
                hidden_dtype,
            )
        return DraftModelProposer(
            model, kv_caches, self.mesh, self.layouts, self.input_batch, self.block_size, self.num_spec_tokens
        )

    def _plan_pipeline(self, model: nnx.Module, state, stage_meshes: Sequence[Mesh]) -> PipelinePlan | None:
        """With several stages: their plan; the stage copies of leaves join `param_leaves`."""
        if len(stage_meshes) <= 1:
            return None
        layer_ranges = stage_layer_ranges(len(self.kv_caches), len(stage_meshes))
        is_tied = model.lm_head is None
        plan, copies = make_pipeline_plan(state, self.param_leaves, stage_meshes, layer_ranges, is_tied)
        self.param_leaves += copies
        return plan

    def compile_or_warm_up_model(self, executable_cache=None) -> float:
        """Compiles both variants of every bucket's step ahead of the first request, side by
        side in threads (XLA compiles and executable loads run outside the GIL; tracing does
        not); returns the seconds spent. `executable_cache` (an `ExecutableCache`) supplies
        the variants compiled by an earlier start and keeps the new ones."""
        start = time.perf_counter()
        variants = [(t, features) for t in self.layouts for features in self.step_variants]
        with concurrent.futures.ThreadPoolExecutor(min(len(variants), os.cpu_count() or 1)) as pool:
            compiled = pool.map(lambda variant: self.compile_layout(*variant, executable_cache), variants)
            self._compiled = dict(zip(variants, compiled))
        if self.drafter is not None:
            self.drafter.compile_after_step() if self.drafts_on_device else self.drafter.compile()
        if self.lora is not None:
            self.lora.warm_up()
            self._reread_lora_params()
        elapsed = time.perf_counter() - start
        logger.info("compiled %d step variants in %.1f s", len(variants), elapsed)
        return elapsed

    def compile_layout(self, num_tokens: int, features: StepFeatures = GENERAL, executable_cache=None):
        """One variant's step: loaded from `executable_cache` when it holds it, else compiled."""
        layout = dataclasses.replace(self.layouts[num_tokens], features=features)
        state = (self.param_leaves, self.kv_caches, self.history, self.slot_tables.arrays)

        def compile_fn():
            if self.plan is not None:
                return compile_pipeline_step(
                    layout, self.layer_group_ids, self.graphdef, self.treedef, *state, self.plan
                )
            return compile_step(layout, self.layer_group_ids, self.graphdef, self.treedef, *state, self.mesh)

        if executable_cache is None or self.plan is not None:
            return compile_fn()
        return executable_cache.get_or_compile(repr(layout), state, compile_fn)

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        output = self._dispatch(scheduler_output)
        return output if non_block else output.get_output()

    def _dispatch(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        self._update_states(scheduler_output)
        scheduled = scheduler_output.num_scheduled_tokens
        failed = {r for r in self._failed_req_ids if r in scheduled} if self._failed_req_ids else set()
        if failed:
            scheduled = {req_id: n for req_id, n in scheduled.items() if req_id not in failed}
        if not scheduled:
            return AsyncModelRunnerOutput(lambda: ModelRunnerOutput([], {}, [], failed_req_ids=failed))
        rows, num_tokens = self._order_rows(scheduled)
        layout = self._layout_for(int(num_tokens.sum()))
        drafts = self._step_drafts(rows, scheduler_output.scheduled_spec_decode_tokens)
        buffer, record = self._prepare_inputs(layout, rows, num_tokens, drafts)
        grammar_bans = self._grammar_bans(layout, scheduler_output, record)
        features = self._features(buffer.fields, rows, record)
        if scheduler_output.grammar_bitmask is not None:
            features = GENERAL
        step = self._compiled[layout.num_tokens, features]
        # A step that reads no token of the last one does not wait for it (pipeline stages
        # then run two steps at once).
        needs_last = (buffer.fields["prev_sampled_index"] >= 0).any()
        packed = self._to_device(buffer.data)
        with self.compile_watch:
            outputs = step(
                self.param_leaves,
                self.kv_caches,
                self.history,
                self.slot_tables.arrays,
                self._last_sampled if needs_last else self._no_last_sampled,
                packed,
                grammar_bans,
            )
        self.kv_caches, self.history, sampled, logprobs, prompt_logprobs, *hidden = outputs
        if self.drafts_on_device and self.drafter is not None:
            prev = self._last_sampled if needs_last else self._no_last_sampled
            sampled = self.drafter.propose_after_step(layout.num_tokens, packed, prev, sampled, *hidden)
        self._last_sampled = sampled
        self._remember_samples(rows, record)
        return AsyncModelRunnerOutput(
            lambda: self._collect(record, sampled, logprobs, prompt_logprobs, failed, *hidden)
        )

    def _remember_samples(self, rows: np.ndarray, record: StepRecord) -> None:
        """Where the next step finds each slot's tokens of this one, not on the host yet."""
        self._sample_index_by_slot.fill(-1)
        is_sampling = record.is_sampling
        if not self.num_spec_tokens:
            self._sample_index_by_slot[rows[is_sampling]] = np.flatnonzero(is_sampling)
        elif self.drafts_on_device:
            num_drafts = np.fromiter(map(len, record.drafts), np.int32, len(rows))
            self._sample_index_by_slot[rows[is_sampling]] = (record.sample_starts + num_drafts)[is_sampling]
            self._prev_row_by_slot.fill(-1)
            self._prev_row_by_slot[rows] = np.arange(len(rows))

    def _grammar_bans(self, layout: StepLayout, so: SchedulerOutput, record: StepRecord) -> jax.Array:
        """The complement of the step's grammar bitmask on the device (a set bit bans a
        token), a row per sampling position in the step's order (the scheduler's rows follow
        `num_scheduled_tokens`, each request's drafts after it); all zeros without a
        constrained row."""
        if so.grammar_bitmask is None:
            if layout.num_samples not in self._no_grammar:
                shape = (layout.num_samples, layout.num_bitmask_words)
                self._no_grammar[layout.num_samples] = filled(shape, np.int32, 0, self.replicated)
            return self._no_grammar[layout.num_samples]
        spec = so.scheduled_spec_decode_tokens
        counts = [1 + len(spec.get(req_id, ())) for req_id in so.num_scheduled_tokens]
        first_row = dict(zip(so.num_scheduled_tokens, np.cumsum(counts) - counts))
        rows = [first_row[req_id] + j for req_id in record.req_ids for j in range(1 + len(spec.get(req_id, ())))]
        bans = np.zeros((layout.num_samples, layout.num_bitmask_words), np.int32)
        bans[: len(rows)] = ~so.grammar_bitmask[rows]
        return put_replicated(bans, self.replicated)

    def _to_device(self, packed: np.ndarray) -> jax.Array:
        """The step's one host-to-device transfer (a second one carries grammar masks)."""
        return put_replicated(packed, self.replicated)

    def _features(self, fields: dict[str, np.ndarray], rows: np.ndarray, record: StepRecord) -> StepFeatures:
        """PLAIN when no row of the step filters, processes its logits or wants logprobs,
        and the platform compiles it."""
        is_below_min_tokens = fields["is_below_min_tokens"][: len(rows)]
        if self.input_batch.uses_general_step[rows].any() or is_below_min_tokens.any():
            return GENERAL
        is_plain = PLAIN in self.step_variants and not record.has_prompt_target.any()
        return PLAIN if is_plain else GENERAL

    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.input_batch
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
            self._failed_req_ids.discard(req_id)
        for req_id in [r for r in batch.req_id_to_index if r not in so.num_scheduled_tokens]:
            output_token_ids = batch.remove_request(req_id)
            self.requests[req_id].output_token_ids = output_token_ids
        for new in so.scheduled_new_reqs:
            seed = new.sampling_params.seed
            state = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=new.prompt_token_ids,
                sampling_params=new.sampling_params,
                seed=(seed if seed is not None else int(self._seed_rng.integers(_SEED_MASK))) & _SEED_MASK,
                block_ids=tuple(list(ids) for ids in new.block_ids),
                eos_token_id=new.eos_token_id,
                lora_request=new.lora_request,
            )
            self.requests[new.req_id] = state
            self._add_to_batch(state, new.num_computed_tokens)
        self._update_cached_requests(so.scheduled_cached_reqs)

    def _fail_request(self, req_id: str) -> None:
        """Drops a request the runner could not take (the error is logged); the scheduler
        finishes it with an error when the step's output reports it."""
        logger.exception("Request %s failed in the model runner; the engine goes on without it.", req_id)
        self.requests.pop(req_id, None)
        self.input_batch.remove_request(req_id)
        self._failed_req_ids.add(req_id)

    def _add_to_batch(self, state: CachedRequestState, num_computed_tokens: int) -> int:
        """The request's slot, -1 when it could not enter the batch (it then fails alone)."""
        try:
            if self.lora is not None:
                self.lora.prepare(state.lora_request)
            row = self.input_batch.add_request(state, num_computed_tokens)
            banned = min_tokens_stop_ids(state) if self.input_batch.bans_stop_ids_in_bias[row] else ()
            self.slot_tables.set_slot(row, state.sampling_params, banned)
            if self.drafter is not None:
                self.drafter.request_entered(row, num_computed_tokens)
        except Exception:
            self._fail_request(state.req_id)
            return -1
        return row

    def _lift_stop_id_bans(self, rows: np.ndarray) -> None:
        """Rows whose bias row bans their stop ids and that reached min_tokens get their own
        bias row back, before the step that may draw a stop id."""
        batch = self.input_batch
        for row in rows.tolist():
            params = self.requests[batch.req_ids[row]].sampling_params
            self.slot_tables.set_slot(row, params)
            batch.bans_stop_ids_in_bias[row] = False
            batch.columns["has_logit_bias"][row] = has_logit_bias(params)

    def _update_cached_requests(self, cached: CachedRequestData) -> None:
        """Most steps only advance the requests' token counts, written for all rows at once;
        requests with new blocks, resumed ones and ones back from a step off the batch are
        updated one by one."""
        batch = self.input_batch
        rows = [batch.req_id_to_index.get(req_id, -1) for req_id in cached.req_ids]
        changes = zip(rows, cached.new_block_ids, cached.resumed_from_preemption)
        for i, (row, new_block_ids, resumed) in enumerate(changes):
            if (row < 0 or new_block_ids is not None or resumed) and cached.req_ids[i] not in self._failed_req_ids:
                state = self.requests[cached.req_ids[i]]
                rows[i] = self._update_cached_request(state, cached.num_computed_tokens[i], new_block_ids, resumed)
        if not self._failed_req_ids:
            batch.num_computed_tokens[rows] = cached.num_computed_tokens
            return
        # Failed requests (and any that failed to re-enter here) hold no row.
        rows = np.asarray(rows, np.int64)
        batch.num_computed_tokens[rows[rows >= 0]] = np.asarray(cached.num_computed_tokens, np.int32)[rows >= 0]

    def _update_cached_request(self, state, num_computed, new_block_ids, resumed) -> int:
        """Applies the request's new blocks, per group (all its blocks when resumed); returns
        its row."""
        if resumed:
            state.block_ids = tuple(list(ids) for ids in new_block_ids)
        elif new_block_ids is not None:
            for ids, new_ids in zip(state.block_ids, new_block_ids, strict=True):
                ids.extend(new_ids)
        row = self.input_batch.req_id_to_index.get(state.req_id)
        if row is None:
            return self._add_to_batch(state, num_computed)
        if new_block_ids is not None and not resumed:
            self.input_batch.block_table.append_row(new_block_ids, row)
        return row

    def _order_rows(self, num_scheduled_tokens: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
        """The scheduled slots, decode rows (one token) first, and their token counts."""
        index = self.input_batch.req_id_to_index
        num_reqs = len(num_scheduled_tokens)
        rows = np.fromiter(map(index.__getitem__, num_scheduled_tokens), np.int32, num_reqs)
        num_tokens = np.fromiter(num_scheduled_tokens.values(), np.int32, num_reqs)
        order = np.argsort(num_tokens > 1, kind="stable")
        return rows[order], num_tokens[order]

    def _layout_for(self, total_tokens: int) -> StepLayout:
        for num_tokens, layout in self.layouts.items():
            if total_tokens <= num_tokens:
                return layout
        raise ValueError(f"{total_tokens} tokens exceed the largest bucket {num_tokens}.")

    def _step_drafts(self, rows: np.ndarray, spec_tokens: dict[str, list[int]]) -> list[list[int]] | None:
        """Each row's drafts (speculative decoding; else None). On the host they are written
        after the row's tokens, where the step reads its input ids; the row's token count
        stays (they are not its tokens yet). On the device they are placeholders (-1)."""
        if not self.num_spec_tokens:
            return None
        batch = self.input_batch
        drafts = [spec_tokens.get(batch.req_ids[row], []) for row in rows.tolist()]
        if self.drafts_on_device:
            has_drafts = np.fromiter(map(len, drafts), np.int32, len(rows)) > 0
            if (self._prev_row_by_slot[rows[has_drafts]] < 0).any():
                raise RuntimeError("the scheduler gave drafts to a request that was not in the last step")
            return drafts
        for row, row_drafts in zip(rows.tolist(), drafts):
            if row_drafts:
                batch.token_ids_cpu[row, batch.num_tokens[row] : batch.num_tokens[row] + len(row_drafts)] = row_drafts
        return drafts

    def _prepare_inputs(
        self, layout: StepLayout, rows: np.ndarray, num_tokens: np.ndarray, drafts: list[list[int]] | None
    ) -> tuple[PackedBuffer, StepRecord]:
        """The filled step buffer, and what `_collect` needs to know of the step; `drafts`:
        each row's (None without speculative decoding)."""
        batch = self.input_batch
        self._num_steps += 1
        buffer = self._packed[layout.num_tokens][self._num_steps % self._num_buffers]
        buffer.reset()
        num_rows, start = len(rows), batch.num_computed_tokens[rows]
        row_of_token, cu, positions = ragged_positions(start, num_tokens)
        seq_lens = start + num_tokens
        token_rows = rows[row_of_token]
        # A token not on the host yet was sampled by the last dispatched step, for the
        # request that holds the same slot now (a request changes slots only off the batch);
        # drafts come after a row's tokens and are on the host.
        known, num_drafts = batch.num_tokens[token_rows], None
        if drafts is not None:
            num_drafts = np.fromiter(map(len, drafts), np.int32, num_rows)
            known = known if self.drafts_on_device else known + num_drafts[row_of_token]
        is_pending = positions >= known
        prev_sampled_index = np.where(is_pending, self._pending_index(token_rows, positions - start[row_of_token]), -1)
        num_pending = np.bincount(row_of_token[is_pending], minlength=num_rows)
        has_target, targets = self._prompt_logprobs_targets(token_rows, positions)
        values = {
            "input_ids": batch.token_ids_cpu[token_rows, positions],
            "prev_sampled_index": prev_sampled_index,
            "positions": positions,
            "slot_mapping": self._slot_mapping(token_rows, positions),
            "token_slots": token_rows,
            "prompt_logprobs_targets": targets,
            "query_start_loc": query_start_loc(cu, layout.num_reqs),
            "seq_lens": seq_lens,
            "num_seqs": np.array([num_rows], np.int32),
            **self._prepare_sampling(rows, cu - 1, self._num_outputs(rows, num_pending, seq_lens, num_drafts)),
        }
        if self.lora is not None:
            values["lora_slots"] = self._lora_slots(rows, row_of_token)
        sample_starts = None
        if drafts is not None:
            sample_starts, positions_values = sample_positions(num_drafts, cu, seq_lens)
            values.update(positions_values, **self._draft_values(rows, seq_lens, num_pending))
        layout.table.fill(buffer.fields, batch.columns, rows, values)
        for group, table in enumerate(batch.block_table.block_tables):
            buffer.set_block_tables(table.block_table, rows, int(table.num_blocks_per_row[rows].max()), group)
        record = StepRecord(
            req_ids=[batch.req_ids[row] for row in rows.tolist()],
            rows=rows,
            slot_versions=batch.slot_versions[rows],
            is_sampling=seq_lens >= batch.num_tokens[rows] + num_pending,
            num_logprobs=batch.num_logprobs[rows],
            may_send_prompt_logprobs=batch.num_prompt_logprobs[rows] >= 0,
            token_rows=row_of_token,
            has_prompt_target=has_target,
            seq_lens=seq_lens,
            drafts=drafts,
            sample_starts=sample_starts,
        )
        return buffer, record

    def _lora_slots(self, rows: np.ndarray, row_of_token: np.ndarray) -> np.ndarray:
        """Each token's LoRA slot, the step's adapters written to the device first (the params
        re-read after a write: same shapes, so nothing recompiles)."""
        loras = [self.requests[self.input_batch.req_ids[row]].lora_request for row in rows.tolist()]
        slots = self.lora.token_slots(loras, row_of_token)
        self._reread_lora_params()
        return slots

    def _loras_in_use(self) -> set[int]:
        return {state.lora_request.lora_int_id for state in self.requests.values() if state.lora_request is not None}

    def _reread_lora_params(self) -> None:
        if self.lora.params_changed:
            self.param_leaves = jax.tree.leaves(nnx.state(self.lora.model))
            self.lora.params_changed = False

    def _pending_index(self, token_rows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Per token (of a row whose tokens start with the last step's sampled one), where it
        is in the last step's output: the sampled token, or with drafts on the device the
        row's (offset - 1)-th draft."""
        index = self._sample_index_by_slot[token_rows]
        if not self.drafts_on_device:
            return index
        drafts = draft_index(self._any_layout, self._prev_row_by_slot[token_rows], offsets - 1)
        return np.where(offsets == 0, index, drafts)

    def _draft_values(self, rows: np.ndarray, seq_lens: np.ndarray, num_pending: np.ndarray) -> dict[str, np.ndarray]:
        """The ASYNC_SPEC_INPUTS: each row's row in the last step when some of its tokens are
        that step's (its counts may be optimistic), and a prompt chunk's next token."""
        batch = self.input_batch
        is_sampling = seq_lens >= batch.num_tokens[rows] + num_pending
        next_token = batch.token_ids_cpu[rows, np.minimum(seq_lens, self.max_model_len - 1)]
        prev_row = self._prev_row_by_slot[rows] if self.drafts_on_device else np.full(len(rows), -1, np.int32)
        return {
            "prev_row_index": np.where(num_pending > 0, prev_row, -1),
            "next_prompt_token": np.where(is_sampling, -1, next_token),
        }

    def _prompt_logprobs_targets(self, token_rows: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per token: whether the step computes the logprob of the prompt token after it, and
        that token (-1 elsewhere)."""
        batch = self.input_batch
        has_target = (batch.num_prompt_logprobs[token_rows] >= 0) & (
            positions + 1 < batch.num_prompt_tokens[token_rows]
        )
        if not has_target.any():
            return has_target, _NO_TARGETS  # the common case: the field keeps its padding
        targets = np.full(len(positions), -1, np.int32)
        targets[has_target] = batch.token_ids_cpu[token_rows[has_target], positions[has_target] + 1]
        return has_target, targets

    def _slot_mapping(self, token_rows: np.ndarray, positions: np.ndarray) -> list[np.ndarray]:
        """Per KV cache group, the cache slot each token's K/V goes to."""
        block_index, offsets = positions // self.block_size, positions % self.block_size
        tables = self.input_batch.block_table.block_tables
        return [table.block_table[token_rows, block_index] * self.block_size + offsets for table in tables]

    def _num_outputs(
        self, rows: np.ndarray, num_pending: np.ndarray, seq_lens: np.ndarray, num_drafts: np.ndarray | None
    ) -> np.ndarray:
        """Per row, its output tokens before its (first) sampled one: the known ones and those
        in flight. With drafts on the device the in-flight count is the scheduler's (every
        draft in flight accepted; the step corrects it): the tokens before the row's drafts."""
        batch = self.input_batch
        if not self.drafts_on_device:
            return batch.num_tokens[rows] + num_pending - batch.num_prompt_tokens[rows]
        return np.maximum(seq_lens - num_drafts - batch.num_prompt_tokens[rows], 0)

    def _prepare_sampling(
        self, rows: np.ndarray, logits_indices: np.ndarray, num_outputs: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The sampled rows' values the step derives (the request columns are copied as they are)."""
        batch = self.input_batch
        is_below_min_tokens = num_outputs < batch.min_tokens[rows]
        is_banning = batch.bans_stop_ids_in_bias[rows]
        if is_banning.any():
            self._lift_stop_id_bans(rows[is_banning & ~is_below_min_tokens])
        return {
            "logits_indices": logits_indices,
            "sample_slots": rows,
            "sample_positions": num_outputs,
            "is_below_min_tokens": is_below_min_tokens,
        }

    def _collect(
        self, record: StepRecord, sampled, logprobs, prompt_logprobs, failed: set[str], hidden=None
    ) -> ModelRunnerOutput:
        """Waits for a step's tokens and appends each to its request (`hidden`: the step's
        hidden states, when an EAGLE head drafts from them).

        A request may have left the batch (preempted) or the runner (finished) since the step
        was dispatched: its token still goes to the scheduler, which decides what to keep.
        """
        num_rows = len(record.req_ids)
        if self.num_spec_tokens:
            sampled_token_ids = accepted_tokens(record, np.asarray(sampled), self._max_num_samples)
            self._append_token_lists(record, sampled_token_ids)
        else:
            tokens = np.asarray(sampled)[:num_rows]
            sampled_token_ids = [
                [token] if is_sampling else []
                for token, is_sampling in zip(tokens.tolist(), record.is_sampling.tolist())
            ]
            self._append_sampled_tokens(record, tokens)
        output = ModelRunnerOutput(
            record.req_ids, dict(zip(record.req_ids, range(num_rows))), sampled_token_ids, failed_req_ids=failed
        )
        collect_logprobs(record, logprobs, prompt_logprobs, self.requests, output)
        if self.drafter is not None and not self.drafts_on_device:
            output.spec_token_ids = self._propose_drafts(record, sampled_token_ids, hidden)
        return output

    def _append_sampled_tokens(self, record: StepRecord, tokens: np.ndarray) -> None:
        """Each sampled token goes to its request's row, all rows at once; a request that left
        the batch since the step was dispatched keeps its tokens in its state instead."""
        batch = self.input_batch
        is_in_batch = batch.slot_versions[record.rows] == record.slot_versions
        is_appended = record.is_sampling & is_in_batch
        batch.append_tokens(record.rows[is_appended], tokens[is_appended])
        for i in np.flatnonzero(record.is_sampling & ~is_in_batch).tolist():
            state = self.requests.get(record.req_ids[i])
            if state is not None:
                state.output_token_ids.append(int(tokens[i]))

    def _append_token_lists(self, record: StepRecord, token_lists: list[list[int]]) -> None:
        """`_append_sampled_tokens` for rows that may keep several tokens (speculative decoding)."""
        batch = self.input_batch
        is_in_batch = batch.slot_versions[record.rows] == record.slot_versions
        for i, tokens in enumerate(token_lists):
            if not tokens:
                continue
            if is_in_batch[i]:
                batch.append_token_list(int(record.rows[i]), tokens)
            elif (state := self.requests.get(record.req_ids[i])) is not None:
                state.output_token_ids.extend(tokens)

    def _propose_drafts(self, record: StepRecord, token_lists: list[list[int]], hidden=None) -> list[list[int]]:
        """Per row, the drafts for its request's next step, from its tokens now."""
        batch = self.input_batch
        limits = []
        for i, tokens in enumerate(token_lists):
            row, state = int(record.rows[i]), self.requests.get(record.req_ids[i])
            is_in_batch = batch.slot_versions[row] == record.slot_versions[i]
            limits.append(self._max_drafts(state, row) if tokens and state is not None and is_in_batch else 0)
        return self.drafter.propose_batch(record, token_lists, limits, hidden)

    def _max_drafts(self, state: CachedRequestState, row: int) -> int:
        """How many drafts the request's next step may verify: none below min_tokens (its
        stop-token bans change per position); else up to max_model_len, and one short of
        max_tokens (the step adds one)."""
        batch, params = self.input_batch, state.sampling_params
        num_tokens = int(batch.num_tokens[row])
        num_outputs = num_tokens - int(batch.num_prompt_tokens[row])
        if num_outputs < batch.min_tokens[row]:
            return 0
        limit = self.max_model_len - num_tokens
        if params.max_tokens is not None:
            limit = min(limit, params.max_tokens - num_outputs - 1)
        return limit
