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

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vjx.config import VjxConfig
from vjx.core.sched.output import SchedulerOutput
from vjx.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vjx.sharding.placement import filled
from vjx.worker.compile_watch import CompileWatch
from vjx.worker.input_batch import CachedRequestState, InputBatch
from vjx.worker.slot_tables import SlotTables
from vjx.worker.step import compile_step, enable_compilation_cache
from vjx.worker.step_layout import GENERAL, PLAIN, StepFeatures, StepLayout, token_buckets
from vjx.worker.step_outputs import StepRecord, collect_logprobs

logger = logging.getLogger(__name__)

_SEED_MASK = 0x7FFFFFFF


class ModelRunner:
    """Owns the persistent batch, the KV cache arrays and the compiled step variants.

    Everything the step reads besides params and KV cache (token history, sampling tables,
    the packed inputs, the previous step's tokens) is replicated over `mesh`.
    """

    def __init__(self, config: VjxConfig, model: nnx.Module, kv_caches: list[jax.Array], mesh: Mesh):
        """`kv_caches`: one array per layer, in the attention backend's layout, on `mesh`."""
        sched = config.scheduler_config
        self.mesh = mesh
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.block_size = config.cache_config.block_size
        self.max_num_reqs = sched.max_num_seqs
        max_blocks = -(-sched.max_model_len // self.block_size)
        self.input_batch = InputBatch(self.max_num_reqs, sched.max_model_len, max_blocks)
        self.requests: dict[str, CachedRequestState] = {}
        self.kv_caches = kv_caches
        self.history = filled((self.max_num_reqs, sched.max_model_len), np.int32, 0, self.replicated)
        self.slot_tables = SlotTables(self.max_num_reqs, config.model_config.hf_config.vocab_size,
                                      self.replicated)
        self.graphdef, state = nnx.split(model)
        self.param_leaves, self.treedef = jax.tree.flatten(state)
        self.layouts = {
            t: StepLayout(t, self.max_num_reqs, min(t, self.max_num_reqs), max_blocks,
                          config.model_config.max_logprobs)
            for t in token_buckets(sched.max_num_batched_tokens)
        }
        # Two host buffers per bucket, used in turn: the CPU backend may alias a numpy array
        # it was handed, so a buffer is refilled only after the step that read it finished
        # (EngineCore keeps at most two steps in flight).
        self._packed = {t: [np.zeros(layout.size, np.int32) for _ in range(2)] for t, layout in self.layouts.items()}
        self._num_steps = 0
        self._compiled = {}
        self._seed_rng = np.random.default_rng(config.model_config.seed)
        self._last_sampled = filled((self.max_num_reqs,), np.int32, 0, self.replicated)
        self._last_sample_index: dict[str, int] = {}
        """Requests the last dispatched step samples for, and their index in its output."""
        self.compile_watch = CompileWatch()

    def compile_or_warm_up_model(self) -> float:
        """Compiles both variants of every bucket's step ahead of the first request, side by
        side in threads (XLA compiles outside the GIL); returns the seconds spent."""
        enable_compilation_cache()
        start = time.perf_counter()
        variants = [(t, features) for t in self.layouts for features in (PLAIN, GENERAL)]
        with concurrent.futures.ThreadPoolExecutor(min(len(variants), os.cpu_count() or 1)) as pool:
            compiled = pool.map(lambda variant: self.compile_layout(*variant), variants)
            self._compiled = dict(zip(variants, compiled))
        elapsed = time.perf_counter() - start
        logger.info("compiled %d step variants in %.1f s", len(variants), elapsed)
        return elapsed

    def compile_layout(self, num_tokens: int, features: StepFeatures = GENERAL):
        layout = dataclasses.replace(self.layouts[num_tokens], features=features)
        return compile_step(
            layout, self.graphdef, self.treedef, self.param_leaves, self.kv_caches,
            self.history, self.slot_tables.arrays, self.mesh,
        )

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        output = self._dispatch(scheduler_output)
        return output if non_block else output.get_output()

    def _dispatch(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        self._update_states(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            return AsyncModelRunnerOutput(lambda: ModelRunnerOutput([], {}, []))
        rows, num_tokens = self._order_rows(scheduler_output)
        layout = self._layout_for(int(num_tokens.sum()))
        packed, record = self._prepare_inputs(layout, rows, num_tokens)
        step = self._compiled[layout.num_tokens, self._features(layout, packed, rows, record)]
        with self.compile_watch:
            self.kv_caches, self.history, sampled, logprobs, prompt_logprobs = step(
                self.param_leaves, self.kv_caches, self.history, self.slot_tables.arrays, self._last_sampled,
                jax.device_put(packed, self.replicated),
            )
        self._last_sampled = sampled
        self._last_sample_index = {r: i for i, r in enumerate(record.req_ids) if record.is_sampling[i]}
        return AsyncModelRunnerOutput(lambda: self._collect(record, sampled, logprobs, prompt_logprobs))

    def _features(self, layout: StepLayout, packed: np.ndarray, rows: np.ndarray, record: StepRecord) -> StepFeatures:
        """PLAIN when no row of the step filters, processes its logits or wants logprobs."""
        is_below_min_tokens = layout.view(packed, "is_below_min_tokens")[: len(rows)]
        if self.input_batch.uses_general_step[rows].any() or is_below_min_tokens.any():
            return GENERAL
        return GENERAL if record.has_prompt_target.any() else PLAIN

    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.input_batch
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
        for req_id in list(batch.req_id_to_index):
            if req_id not in so.num_scheduled_tokens:
                batch.remove_request(req_id)
        for new in so.scheduled_new_reqs:
            seed = new.sampling_params.seed
            state = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=new.prompt_token_ids,
                sampling_params=new.sampling_params,
                seed=(seed if seed is not None else int(self._seed_rng.integers(_SEED_MASK))) & _SEED_MASK,
                block_ids=list(new.block_ids[0]),
                num_computed_tokens=new.num_computed_tokens,
                eos_token_id=new.eos_token_id,
            )
            self.requests[new.req_id] = state
            self._add_to_batch(state)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            self._update_cached_request(
                self.requests[req_id],
                cached.num_computed_tokens[i],
                cached.new_block_ids[i],
                cached.resumed_from_preemption[i],
            )

    def _add_to_batch(self, state: CachedRequestState) -> None:
        row = self.input_batch.add_request(state)
        self.slot_tables.set_slot(row, state.sampling_params)

    def _update_cached_request(self, state, num_computed, new_block_ids, resumed) -> None:
        batch = self.input_batch
        state.num_computed_tokens = num_computed
        new_ids = list(new_block_ids[0]) if new_block_ids is not None else []
        state.block_ids = new_ids if resumed else state.block_ids + new_ids
        row = batch.req_id_to_index.get(state.req_id)
        if row is None:
            self._add_to_batch(state)
            return
        batch.num_computed_tokens[row] = num_computed
        if new_ids:
            batch.block_table.append_row(new_ids, row)

    def _order_rows(self, so: SchedulerOutput) -> tuple[np.ndarray, np.ndarray]:
        """The scheduled slots, decode rows (one token) first, and their token counts."""
        index = self.input_batch.req_id_to_index
        rows = np.fromiter((index[r] for r in so.num_scheduled_tokens), np.int32)
        num_tokens = np.fromiter(so.num_scheduled_tokens.values(), np.int32)
        order = np.argsort(num_tokens > 1, kind="stable")
        return rows[order], num_tokens[order]

    def _layout_for(self, total_tokens: int) -> StepLayout:
        for num_tokens, layout in self.layouts.items():
            if total_tokens <= num_tokens:
                return layout
        raise ValueError(f"{total_tokens} tokens exceed the largest bucket {num_tokens}.")

    def _prepare_inputs(
        self, layout: StepLayout, rows: np.ndarray, num_tokens: np.ndarray
    ) -> tuple[np.ndarray, StepRecord]:
        """The packed step buffer, and what `_collect` needs to know of the step."""
        batch = self.input_batch
        self._num_steps += 1
        packed = self._packed[layout.num_tokens][self._num_steps % 2]
        packed.fill(0)
        num_rows, total = len(rows), int(num_tokens.sum())
        start = batch.num_computed_tokens[rows]
        cu = np.cumsum(num_tokens)
        row_of_token = np.repeat(np.arange(num_rows), num_tokens)
        positions = start[row_of_token] + np.arange(total) - (cu - num_tokens)[row_of_token]
        token_rows = rows[row_of_token]
        layout.view(packed, "input_ids")[:total] = batch.token_ids_cpu[token_rows, positions]
        is_pending = positions >= batch.num_tokens[token_rows]
        prev_index = layout.view(packed, "prev_sampled_index")
        prev_index[:] = -1
        prev_index[:total][is_pending] = [self._last_sample_index[batch.req_ids[r]] for r in token_rows[is_pending]]
        num_pending = np.bincount(row_of_token[is_pending], minlength=num_rows)
        layout.view(packed, "positions")[:total] = positions
        layout.view(packed, "token_slots")[:] = self.max_num_reqs
        layout.view(packed, "token_slots")[:total] = token_rows
        targets = layout.view(packed, "prompt_logprobs_targets")
        targets[:] = -1
        has_target = (batch.num_prompt_logprobs[token_rows] >= 0) & (positions + 1 < batch.num_prompt_tokens[token_rows])
        targets[:total][has_target] = batch.token_ids_cpu[token_rows[has_target], positions[has_target] + 1]
        blocks = batch.block_table.block_table[token_rows, positions // self.block_size]
        layout.view(packed, "slot_mapping")[:total] = blocks * self.block_size + positions % self.block_size
        layout.view(packed, "query_start_loc")[1 : num_rows + 1] = cu
        layout.view(packed, "query_start_loc")[num_rows + 1 :] = total
        layout.view(packed, "seq_lens")[:num_rows] = start + num_tokens
        layout.view(packed, "num_seqs")[0] = num_rows
        layout.view(packed, "block_tables")[:num_rows] = batch.block_table.block_table[rows]
        self._prepare_sampling(layout, packed, rows, cu - 1, num_pending)
        record = StepRecord(
            req_ids=[batch.req_ids[row] for row in rows.tolist()],
            is_sampling=start + num_tokens >= batch.num_tokens[rows] + num_pending,
            num_logprobs=batch.num_logprobs[rows],
            token_rows=row_of_token,
            has_prompt_target=has_target,
        )
        return packed, record

    def _prepare_sampling(self, layout, packed, rows, logits_indices, num_pending) -> None:
        batch, num_rows = self.input_batch, len(rows)
        layout.view(packed, "logits_indices")[:num_rows] = logits_indices
        layout.view(packed, "temperature")[:num_rows] = batch.temperature[rows]
        layout.view(packed, "top_k")[:num_rows] = batch.top_k[rows]
        layout.view(packed, "top_p")[:] = 1.0
        layout.view(packed, "top_p")[:num_rows] = batch.top_p[rows]
        layout.view(packed, "seeds")[:num_rows] = batch.seeds[rows]
        layout.view(packed, "sample_slots")[:num_rows] = rows
        layout.view(packed, "min_p")[:num_rows] = batch.min_p[rows]
        layout.view(packed, "presence_penalty")[:num_rows] = batch.presence_penalty[rows]
        layout.view(packed, "frequency_penalty")[:num_rows] = batch.frequency_penalty[rows]
        layout.view(packed, "repetition_penalty")[:] = 1.0
        layout.view(packed, "repetition_penalty")[:num_rows] = batch.repetition_penalty[rows]
        layout.view(packed, "num_prompt_tokens")[:num_rows] = batch.num_prompt_tokens[rows]
        layout.view(packed, "num_logprobs")[:] = -1
        layout.view(packed, "num_logprobs")[:num_rows] = batch.num_logprobs[rows]
        layout.view(packed, "has_logit_bias")[:num_rows] = batch.has_logit_bias[rows]
        num_outputs = batch.num_tokens[rows] + num_pending - batch.num_prompt_tokens[rows]
        layout.view(packed, "sample_positions")[:num_rows] = num_outputs
        layout.view(packed, "is_below_min_tokens")[:num_rows] = num_outputs < batch.min_tokens[rows]
        layout.view(packed, "stop_token_ids")[:] = -1
        layout.view(packed, "stop_token_ids")[:num_rows] = batch.min_tokens_stop_ids[rows]

    def _collect(self, record: StepRecord, sampled, logprobs, prompt_logprobs) -> ModelRunnerOutput:
        """Waits for a step's tokens and appends each to its request.

        A request may have left the batch (preempted) or the runner (finished) since the step
        was dispatched: its token still goes to the scheduler, which decides what to keep.
        """
        sampled = np.asarray(sampled)
        batch = self.input_batch
        sampled_token_ids = []
        for i, req_id in enumerate(record.req_ids):
            if not record.is_sampling[i]:
                sampled_token_ids.append([])
                continue
            token = int(sampled[i])
            sampled_token_ids.append([token])
            state = self.requests.get(req_id)
            if state is not None:
                state.output_token_ids.append(token)
            row = batch.req_id_to_index.get(req_id)
            if row is not None:
                batch.append_token(row, token)
        index = {req_id: i for i, req_id in enumerate(record.req_ids)}
        output = ModelRunnerOutput(record.req_ids, index, sampled_token_ids)
        collect_logprobs(record, logprobs, prompt_logprobs, self.requests, output)
        return output
