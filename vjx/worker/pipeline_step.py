"""The step of a pipeline-parallel engine: one program per stage, called as one step.

Stage s runs its layers on its own mesh (vjx/sharding/pipeline.py): the first stage also
embeds the step's tokens, the last also runs the final norm, the LM head and the sampler
(`step.sample_step`). Between stages the residual stream (T x D) is copied to the next
stage's devices; the first stage's token ids go to the last (for the history) and the last
stage's samples back to the first (a later step's inputs). Every call is asynchronous, so
while stage s runs one step the host may already dispatch the next, and stage s - 1 starts
on it: the engine keeps two steps in flight (async scheduling).

Each stage program takes only its own params, so it rebuilds the model with zeros in place
of the other stages' params; they are never read, and XLA drops them from the program.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vjx.sharding.pipeline import param_stages
from vjx.sharding.placement import abstract_like
from vjx.worker.step import layer_attention_metadata, sample_step, step_input_ids
from vjx.worker.step_layout import StepLayout


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """Which devices, layers and param leaves each stage has."""

    meshes: tuple[Mesh, ...]
    layer_ranges: tuple[range, ...]
    leaf_ids: tuple[tuple[tuple[int, int], ...], ...]
    """Per stage, (index in the runner's param leaves, index among the model's leaves) of
    each leaf the stage holds (a tied embedding has a copy on the last stage)."""

    @property
    def num_stages(self) -> int:
        return len(self.meshes)

    def replicated(self, stage: int) -> NamedSharding:
        return NamedSharding(self.meshes[stage], PartitionSpec())


def _stage_model(graphdef, treedef, leaf_structs, leaf_ids, leaves):
    """The model with this stage's leaves and zeros for every other."""
    full = [jnp.zeros(struct.shape, struct.dtype) for struct in leaf_structs]
    for (_, model_index), leaf in zip(leaf_ids, leaves, strict=True):
        full[model_index] = leaf
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, full))


def _stage_fn(layout: StepLayout, layer_group_ids, graphdef, treedef, leaf_structs, plan: PipelinePlan, stage: int):
    layers = plan.layer_ranges[stage]
    group_ids = tuple(layer_group_ids[i] for i in layers)
    is_first, is_last = stage == 0, stage == plan.num_stages - 1

    def run(leaves, kv_caches, carry, packed, *last_args):
        f = layout.unpack(packed)
        model = _stage_model(graphdef, treedef, leaf_structs, plan.leaf_ids[stage], leaves)
        decoder = model.model
        if is_first:
            input_ids = step_input_ids(f, carry)
            x = decoder.embed(input_ids)
        else:
            x, input_ids = carry
        md = layer_attention_metadata(layout, group_ids, f)
        x, kv_caches = decoder.run_layers(x, f["positions"], kv_caches, md, layers)
        if not is_last:
            return kv_caches, (x, input_ids)
        history, slot_tables, grammar_bans = last_args
        hidden = decoder.norm(x)
        return kv_caches, *sample_step(layout, model, f, hidden, input_ids, history, slot_tables, grammar_bans)

    return run


class PipelineStep:
    """The stage programs of one step variant, called as `model_step` is."""

    def __init__(self, plan: PipelinePlan, programs: list):
        self.plan = plan
        self.programs = programs

    def __call__(self, param_leaves, kv_caches, history, slot_tables, prev_sampled, packed, grammar_bans):
        plan = self.plan
        new_caches = []
        carry = jax.device_put(prev_sampled, plan.replicated(0))
        for stage, program in enumerate(self.programs):
            leaves = [param_leaves[i] for i, _ in plan.leaf_ids[stage]]
            caches = [kv_caches[i] for i in plan.layer_ranges[stage]]
            stage_packed = jax.device_put(packed, plan.replicated(stage))
            if stage < plan.num_stages - 1:
                caches, carry = program(leaves, caches, carry, stage_packed)
                carry = jax.device_put(carry, plan.replicated(stage + 1))
            else:
                caches, history, sampled, logprobs, prompt_logprobs = program(
                    leaves, caches, carry, stage_packed, history, slot_tables, grammar_bans
                )
            new_caches.extend(caches)
        return new_caches, history, sampled, logprobs, prompt_logprobs

    def memory_analysis(self):
        """The stage with the most scratch memory's analysis."""
        analyses = [program.memory_analysis() for program in self.programs]
        return max(analyses, key=lambda analysis: analysis.temp_size_in_bytes)


def compile_pipeline_step(
    layout: StepLayout, layer_group_ids, graphdef, treedef, param_leaves, kv_caches, history, slot_tables, plan
) -> PipelineStep:
    """AOT-compiles each stage's program for one layout, each under its own mesh. Params and
    KV caches keep their shardings (the caches go out as they came in, donated); the rest is
    replicated over the stage's mesh."""
    structs = abstract_like
    model_leaves = structs(param_leaves[: treedef.num_leaves])
    carry = jax.ShapeDtypeStruct((layout.sampled_size,), jnp.int32, sharding=plan.replicated(0))
    programs = []
    for stage in range(plan.num_stages):
        replicated = plan.replicated(stage)
        fn = _stage_fn(layout, layer_group_ids, graphdef, treedef, model_leaves, plan, stage)
        leaves = structs([param_leaves[i] for i, _ in plan.leaf_ids[stage]])
        caches = structs([kv_caches[i] for i in plan.layer_ranges[stage]])
        packed = jax.ShapeDtypeStruct((layout.size,), jnp.int32, sharding=replicated)
        cache_shardings = [cache.sharding for cache in caches]
        if stage < plan.num_stages - 1:
            args, donate, out_shardings = (leaves, caches, carry, packed), (1,), (cache_shardings, replicated)
        else:
            bans = jax.ShapeDtypeStruct((layout.num_reqs, layout.num_bitmask_words), jnp.int32, sharding=replicated)
            args = (leaves, caches, carry, packed, structs(history), structs(slot_tables), bans)
            donate, out_shardings = (1, 4), (cache_shardings, history.sharding, replicated, replicated, replicated)
        with jax.set_mesh(plan.meshes[stage]):
            programs.append(jax.jit(fn, out_shardings=out_shardings, donate_argnums=donate).lower(*args).compile())
            if stage < plan.num_stages - 1:
                carry = jax.eval_shape(fn, *args)[1]
        carry = _on(carry, plan.replicated(min(stage + 1, plan.num_stages - 1)))
    return PipelineStep(plan, programs)


def _on(tree, sharding):
    """`tree`'s shapes and dtypes as structs with `sharding`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def make_pipeline_plan(state, param_leaves: list, meshes, layer_ranges, is_tied: bool) -> tuple[PipelinePlan, list]:
    """The plan for a model's params (`state`, flattened as `param_leaves`, each placed on the
    first stage that holds it by the loader), and the copies of leaves a later stage also
    holds (a tied embedding on the last stage), to append to `param_leaves`."""
    paths = [jax.tree_util.keystr(path, simple=True, separator=".") for path, _ in jax.tree.flatten_with_path(state)[0]]
    leaf_ids: list[list[tuple[int, int]]] = [[] for _ in meshes]
    copies = []
    for index, (path, leaf) in enumerate(zip(paths, param_leaves, strict=True)):
        first, *others = param_stages(path, list(layer_ranges), is_tied)
        leaf_ids[first].append((index, index))
        for stage in others:
            leaf_ids[stage].append((len(param_leaves) + len(copies), index))
            copies.append(jax.device_put(leaf, NamedSharding(meshes[stage], leaf.sharding.spec)))
    plan = PipelinePlan(tuple(meshes), tuple(layer_ranges), tuple(tuple(ids) for ids in leaf_ids))
    return plan, copies
