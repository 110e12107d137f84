"""Pipeline parallelism on eight CPU devices: the layers split into stages, each stage on its
own devices (tensor parallelism inside it), the same greedy tokens as one device.

A tiny random Llama of 4 layers with tied embeddings (the last stage holds a copy of the
embedding for the LM head). A 16-token budget chunks the longer prompts, and a pool of 5
blocks preempts requests during the run, so both happen with stages in flight; with async
scheduling two steps are in flight at once.
"""

import dataclasses

import pytest

from tests.helpers.tiny_llama import ENGINE_ARGS, PROMPTS, save_tiny_llama
from vjx import LLM, EngineArgs, SamplingParams
from vjx.sharding.pipeline import param_stages, stage_layer_ranges

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PP_ARGS = dict(ENGINE_ARGS, num_gpu_blocks_override=5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("llama-pp")
    save_tiny_llama(path, 2, seed=7, num_hidden_layers=4, tie_word_embeddings=True)
    return str(path)


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference_tokens(model_dir) -> list[list[int]]:
    return _greedy(LLM(model_dir, **ENGINE_ARGS))


def _engine_cores(llm: LLM) -> list:
    client = llm.llm_engine.engine_core
    return [core for core in getattr(client, "engine_cores", [getattr(client, "engine_core", None)])]


@pytest.mark.parametrize(
    ("pp", "tp", "dp", "async_scheduling"),
    [(2, 1, 1, True), (4, 1, 1, False), (2, 2, 1, False), (2, 2, 2, True)],
)
def test_pipeline_stages_give_one_device_tokens(model_dir, reference_tokens, pp, tp, dp, async_scheduling):
    args = dict(PP_ARGS, async_scheduling=async_scheduling)
    llm = LLM(model_dir, pipeline_parallel_size=pp, tensor_parallel_size=tp, data_parallel_size=dp, **args)
    tokens = _greedy(llm)
    assert tokens == reference_tokens
    assert len({t for row in tokens for t in row}) > 4
    cores = _engine_cores(llm)
    assert sum(core.scheduler.num_preemptions for core in cores) > 0
    for core in cores:
        worker = core.model_executor.worker
        stage_devices = [[d.id for d in mesh.devices.flat] for mesh in worker.stage_meshes]
        first = core.config.parallel_config.data_parallel_rank * pp * tp
        assert stage_devices == [list(range(first + s * tp, first + (s + 1) * tp)) for s in range(pp)]
        # Each layer's params and KV cache are on its stage's devices.
        layers = worker.model.model.layers
        for stage, layer_ids in enumerate(worker.layer_ranges):
            for i in layer_ids:
                kernel = layers[i].self_attn.qkv_proj.kernel[...]
                assert kernel.sharding.mesh.devices.tolist() == worker.stage_meshes[stage].devices.tolist()
                cache = worker.model_runner.kv_caches[i]
                assert cache.sharding.mesh.devices.tolist() == worker.stage_meshes[stage].devices.tolist()
    del llm


def test_stage_layer_ranges_give_earlier_stages_the_extra_layers():
    assert stage_layer_ranges(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layer_ranges(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_layer_ranges(30, 4) == [range(0, 8), range(8, 16), range(16, 23), range(23, 30)]
    with pytest.raises(ValueError, match=r"pipeline_parallel_size must be in \[1, 4\]"):
        stage_layer_ranges(4, 5)


def test_param_stages():
    ranges = stage_layer_ranges(4, 2)
    assert param_stages("model.layers.3.mlp.down_proj.kernel", ranges, is_tied=False) == (1,)
    assert param_stages("model.layers.1.self_attn.qkv_proj.kernel", ranges, is_tied=False) == (0,)
    assert param_stages("model.embed_tokens.embedding", ranges, is_tied=False) == (0,)
    assert param_stages("model.embed_tokens.embedding", ranges, is_tied=True) == (0, 1)
    assert param_stages("model.norm.weight", ranges, is_tied=False) == (1,)
    assert param_stages("lm_head.kernel", ranges, is_tied=False) == (1,)


def test_too_many_stages_are_refused(model_dir):
    with pytest.raises(ValueError, match=r"pipeline_parallel_size must be in \[1, 4\]"):
        EngineArgs(model_dir, pipeline_parallel_size=8, **ENGINE_ARGS).create_engine_config()
    with pytest.raises(ValueError, match="only 8 are available"):
        EngineArgs(model_dir, pipeline_parallel_size=4, tensor_parallel_size=4, **ENGINE_ARGS).create_engine_config()


def test_stage_configs_are_frozen(model_dir):
    config = EngineArgs(model_dir, pipeline_parallel_size=2, **ENGINE_ARGS).create_engine_config()
    assert config.parallel_config.pipeline_parallel_size == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.parallel_config.pipeline_parallel_size = 3
