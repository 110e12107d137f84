"""The executable cache: a second engine loads every step variant instead of compiling it.

Engines on a tiny random Llama with one 16-token bucket (one step variant on the CPU,
GENERAL). JAX's persistent cache (and with it the executable cache) is the module's own, so
the first engine must compile and store every variant; outputs must not depend on whether a
step was compiled or loaded.
"""

import logging
import os
import shutil

import jax
import jax.numpy as jnp
import pytest
from jax._src import compilation_cache

from tests.helpers.tiny_llama import ENGINE_ARGS, PROMPTS, save_tiny_llama
from vjx import LLM, EngineArgs, SamplingParams
from vjx.sharding.mesh import make_mesh
from vjx.worker import executable_cache
from vjx.worker.step_layout import decode_buckets, step_variants, token_buckets

BUDGET = ENGINE_ARGS["max_num_batched_tokens"]
NUM_VARIANTS = len(token_buckets(BUDGET, decode_buckets("cpu", BUDGET))) * len(step_variants("cpu"))
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=6, logprobs=2, ignore_eos=True),
]
"""A greedy batch, and a seeded top-p batch with logprobs (PLAIN and GENERAL where both are compiled)."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path, 2, seed=3)
    return path


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A fresh JAX persistent cache (and so executable cache) for the module: the first
    engine must compile, not read tests/conftest.py's shared cache."""
    shared = jax.config.jax_compilation_cache_dir
    root = tmp_path_factory.mktemp("jax-cache")
    jax.config.update("jax_compilation_cache_dir", str(root))
    compilation_cache.reset_cache()
    yield executable_cache.cache_directory()
    jax.config.update("jax_compilation_cache_dir", shared)
    compilation_cache.reset_cache()


def _start(model_dir) -> tuple[LLM, executable_cache.ExecutableCache]:
    llm = LLM(model=str(model_dir), **ENGINE_ARGS)
    return llm, llm.llm_engine.engine_core.engine_core.model_executor.worker.executable_cache


def _outputs(llm: LLM) -> list:
    results = []
    for params in PARAMS:
        for output in llm.generate(PROMPTS, params, use_tqdm=False):
            completion = output.outputs[0]
            results.append((completion.token_ids, completion.logprobs))
    return results


@pytest.fixture(scope="module")
def first(model_dir, cache_dir):
    llm, cache = _start(model_dir)
    return cache.num_hits, cache.num_misses, _outputs(llm)


def test_first_engine_compiles_and_stores_every_variant(first, cache_dir):
    num_hits, num_misses, _ = first
    assert (num_hits, num_misses) == (0, NUM_VARIANTS)
    assert len(list(cache_dir.rglob("*.bin"))) == NUM_VARIANTS


def test_second_engine_loads_every_variant_and_matches(first, model_dir, cache_dir):
    llm, cache = _start(model_dir)
    assert (cache.num_hits, cache.num_misses) == (NUM_VARIANTS, 0)
    assert _outputs(llm) == first[2]


def test_a_broken_entry_is_compiled_again_with_a_warning(first, model_dir, cache_dir, caplog):
    for path in cache_dir.rglob("*.bin"):
        path.write_bytes(b"not an executable")
    with caplog.at_level(logging.WARNING, logger=executable_cache.__name__):
        llm, cache = _start(model_dir)
    assert (cache.num_hits, cache.num_misses) == (0, NUM_VARIANTS)
    assert sum("ignoring the cached executable" in r.message for r in caplog.records) == NUM_VARIANTS
    assert _outputs(llm) == first[2]


def test_executables_that_jax_s_cache_served_are_not_stored(first, model_dir, cache_dir):
    """XLA:CPU loses kernels when a deserialized executable is serialized again."""
    for path in cache_dir.rglob("*.bin"):
        path.unlink()
    llm, cache = _start(model_dir)
    assert (cache.num_hits, cache.num_misses) == (0, NUM_VARIANTS)
    assert list(cache_dir.rglob("*.bin")) == []
    assert _outputs(llm) == first[2]


def _cache_for(model_dir, directory, dtype="float32") -> executable_cache.ExecutableCache:
    config = EngineArgs(model=str(model_dir), dtype=dtype, **ENGINE_ARGS).create_engine_config()
    return executable_cache.ExecutableCache(directory, config, make_mesh(config.parallel_config))


def test_the_key_names_the_program_and_its_inputs_not_the_model_path(model_dir, tmp_path):
    other_dir = tmp_path / "copy"
    shutil.copytree(model_dir, other_dir)
    args = (jnp.zeros(3), [jnp.zeros((2, 2), jnp.int32)])
    key = _cache_for(model_dir, tmp_path).key("layout", args)
    assert _cache_for(other_dir, tmp_path).key("layout", args) == key
    assert _cache_for(model_dir, tmp_path, "bfloat16").key("layout", args) != key
    assert _cache_for(model_dir, tmp_path).key("other layout", args) != key
    assert _cache_for(model_dir, tmp_path).key("layout", (jnp.zeros(4), args[1])) != key


def test_only_the_latest_source_versions_are_kept(model_dir, tmp_path):
    for age in range(5):
        folder = tmp_path / f"version-{age}"
        folder.mkdir()
        os.utime(folder, (1000 - age, 1000 - age))
    _cache_for(model_dir, tmp_path)._drop_old_versions()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["version-0", "version-1", "version-2"]
