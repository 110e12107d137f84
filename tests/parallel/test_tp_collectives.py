"""The compiled tensor-parallel step communicates only what Megatron-style TP needs.

A TP 2 engine on CPU devices, with the GPU's attention backend (Pallas kernels, in interpret
mode here) under `shard_map`. In each compiled step variant the collectives must be exactly:
one all-reduce of [T, D] after the vocab-parallel embedding lookup, two per decoder layer
(after o_proj and after down_proj), and all-gathers of logits rows only ([R, V], R <= T):
no weight is ever gathered, and activations are not resharded around attention (no
all-to-all, collective-permute or reduce-scatter). The KV caches are donated: each is
aliased to its output, so the step updates them in place instead of copying them.
"""

import re

import pytest
from jax.sharding import PartitionSpec as P

from tests.helpers.tiny_llama import ENGINE_ARGS, HIDDEN, VOCAB, save_tiny_llama
from vjx import LLM
from vjx.worker import model_runner
from vjx.worker.step_layout import GENERAL, PLAIN

NUM_LAYERS = 2
TENSOR_PARALLEL_SIZE = 2
_COLLECTIVE = re.compile(
    r"= \(?(\w+)\[([\d,]*)\][^=]*? (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?:-start)?\("
)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-tp-collectives")
    # The Pallas kernels need a head_dim that is a power of two >= 16.
    save_tiny_llama(path, num_kv_heads=2, seed=5, head_dim=16)
    # Both step variants, as an accelerator compiles them (the CPU compiles GENERAL alone).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_runner, "step_variants", lambda platform: (PLAIN, GENERAL))
        llm = LLM(str(path), tensor_parallel_size=TENSOR_PARALLEL_SIZE, attention_backend="pallas_gpu", **ENGINE_ARGS)
    return llm.llm_engine.engine_core.engine_core.model_executor.worker.model_runner


def _collectives(hlo: str) -> list[tuple[str, tuple[int, ...]]]:
    """(kind, result shape) of every collective in the optimized HLO, nested computations too."""
    return [(kind, tuple(int(d) for d in dims.split(",") if d)) for _, dims, kind in _COLLECTIVE.findall(hlo)]


def _aliases(hlo: str) -> set[tuple[int, int]]:
    """(output index, parameter number) pairs of the module's input_output_alias."""
    header = hlo.splitlines()[0]
    return {(int(out), int(param)) for out, param in re.findall(r"\{(\d+)\}: \((\d+), \{\}", header)}


def test_collectives_are_the_megatron_minimum(runner):
    weight_shapes = {tuple(leaf.shape) for leaf in runner.param_leaves}
    assert runner.mesh.shape["model"] == TENSOR_PARALLEL_SIZE
    assert PLAIN in {features for _, features in runner._compiled}
    for (num_tokens, features), executable in runner._compiled.items():
        collectives = _collectives(executable.as_text())
        kinds = [kind for kind, _ in collectives]
        name = f"T{num_tokens} {features}"
        assert kinds.count("all-reduce") == 2 * NUM_LAYERS + 1, name
        assert {shape for kind, shape in collectives if kind == "all-reduce"} == {(num_tokens, HIDDEN)}, name
        gathers = [shape for kind, shape in collectives if kind == "all-gather"]
        assert gathers, name
        for shape in gathers:
            assert len(shape) == 2 and shape[1] == VOCAB and shape[0] <= num_tokens, (name, shape)
            assert shape not in weight_shapes, (name, shape)
        assert set(kinds) <= {"all-reduce", "all-gather"}, (name, kinds)


def test_kv_caches_are_updated_in_place(runner):
    num_params = len(runner.param_leaves)
    assert len(runner.kv_caches) == NUM_LAYERS
    for executable in runner._compiled.values():
        aliases = _aliases(executable.as_text())
        for layer in range(NUM_LAYERS):
            assert (layer, num_params + layer) in aliases
    for cache in runner.kv_caches:
        # The Pallas layout [2, K, P, S, H]: each device holds one of the two KV heads.
        assert cache.sharding.spec == P(None, "model", None, None, None)
        assert {shard.data.shape[1] for shard in cache.addressable_shards} == {1}
