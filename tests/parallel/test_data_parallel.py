"""Data parallelism: independent engine replicas on disjoint device groups behind one client.

Two replicas of tensor parallelism 2 (devices 0-1 and 2-3) must give the same greedy tokens
as one device, in this process and with one engine process per replica; requests go to the
least loaded replica and stats add up over replicas. The model ties its embeddings (the
vocab-parallel embedding table is the LM head) and has attention biases. `update_weights`
reaches every replica: another model's weights by name give its tokens on both, and the first
model's `get_weights()` pytree (replica 0's sharded arrays) puts its tokens back.
"""

import asyncio
import dataclasses

import jax
import pytest
from jax.sharding import PartitionSpec as P

from tests.helpers.tiny_llama import ENGINE_ARGS, PROMPTS, save_tiny_llama
from tests.lora.lora_models import hf_greedy
from vjx import LLM, AsyncLLM, EngineArgs, SamplingParams
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.core_client import LoadBalancer, merge_stats
from vjx.engine.core_proc import ReplicaPlacement, _replica_config, replica_placement
from vjx.engine.messages import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vjx.sharding.mesh import make_mesh

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
DP_ARGS = dict(ENGINE_ARGS, tensor_parallel_size=2, data_parallel_size=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("llama-dp")
    save_tiny_llama(path, 2, seed=5, tie_word_embeddings=True, attention_bias=True)
    return str(path)


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference_tokens(model_dir) -> list[list[int]]:
    return _greedy(LLM(model_dir, **ENGINE_ARGS))


def test_in_process_replicas_equal_one_device(model_dir, reference_tokens, tmp_path):
    llm = LLM(model_dir, **DP_ARGS)
    client = llm.llm_engine.engine_core
    workers = [core.model_executor.worker for core in client.engine_cores]
    assert [[d.id for d in w.mesh.devices.flat] for w in workers] == [[0, 1], [2, 3]]
    model = workers[1].model
    assert model.lm_head is None
    assert model.model.embed_tokens.embedding[...].sharding.spec == P("model", None)
    assert model.model.layers[0].self_attn.qkv_proj.bias[...].sharding.spec == P("model", None, None)
    assert _greedy(llm) == reference_tokens
    stats = [core.make_stats() for core in client.engine_cores]
    assert all(s.num_scheduled_tokens > 0 for s in stats)
    assert client.balancer.num_unfinished == [0, 0] and not client.balancer.replica_of
    original = llm.get_weights()
    other = save_tiny_llama(tmp_path, 2, seed=6, tie_word_embeddings=True, attention_bias=True)
    llm.update_weights({name: t.detach().numpy() for name, t in other.state_dict().items()})
    expected = [hf_greedy(other, p["prompt_token_ids"], GREEDY.max_tokens) for p in PROMPTS]
    assert _greedy(llm) == expected != reference_tokens
    llm.update_weights(original)
    assert _greedy(llm) == reference_tokens


def test_requests_alternate_between_equally_loaded_replicas(model_dir):
    llm = LLM(model_dir, **DP_ARGS)
    engine = llm.llm_engine
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, GREEDY)
    balancer = engine.engine_core.balancer
    assert balancer.replica_of == {"0": 0, "1": 1, "2": 0, "3": 1}
    engine.abort_request(["2"])
    assert balancer.num_unfinished == [1, 2]
    engine.add_request("4", PROMPTS[0], GREEDY)
    assert balancer.replica_of["4"] == 0
    while engine.has_unfinished_requests():
        engine.step()
    assert balancer.num_unfinished == [0, 0]
    assert engine.engine_core.make_stats().num_running_reqs == 0


def test_engine_process_per_replica_equals_one_device(model_dir, reference_tokens):
    llm = LLM(model_dir, **{**DP_ARGS, "multiprocess": True})
    client = llm.llm_engine.engine_core
    try:
        assert len(client.engines) == 2 and client.engines[1].is_alive()
        assert _greedy(llm) == reference_tokens
        stats = client.make_stats()
        assert stats.num_steps > 0 and (stats.num_running_reqs, stats.kv_cache_usage) == (0, 0.0)
        assert client.reset_prefix_cache() is True
    finally:
        llm.shutdown()
    assert not any(engine.is_alive() for engine in client.engines)


def test_async_llm_streams_from_both_replicas(model_dir, reference_tokens):
    """The HTTP server's engine: two replica processes behind one `AsyncMPClient`."""
    args = {k: v for k, v in DP_ARGS.items() if k != "multiprocess"}
    engine = AsyncLLM(EngineArgs(model_dir, **args))

    async def scenario():
        async def collect(i, prompt):
            tokens = []
            async for output in engine.generate(prompt, GREEDY, f"r{i}"):
                tokens = output.outputs[0].token_ids
            return tokens

        tasks = [asyncio.create_task(collect(i, p)) for i, p in enumerate(PROMPTS)]
        await asyncio.sleep(0)
        replicas = sorted(engine.engine_core.balancer.replica_of.values())
        return replicas, await asyncio.gather(*tasks), await engine.get_stats()

    try:
        replicas, tokens, stats = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert replicas == [0, 0, 1, 1]
    assert tokens == reference_tokens
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)
    assert not engine.engine_core.balancer.replica_of


def test_load_balancer_tracks_unfinished_requests():
    balancer = LoadBalancer(3)
    assert [balancer.assign(r) for r in "abcd"] == [0, 1, 2, 0]
    done = EngineCoreOutputs([EngineCoreOutput("b", [5], FinishReason.LENGTH), EngineCoreOutput("a", [6])])
    balancer.note_outputs(done)
    assert balancer.num_unfinished == [2, 0, 1]
    assert balancer.assign("e") == 1
    assert balancer.release(["d", "gone"]) == {0: ["d", "gone"], 1: ["gone"], 2: ["gone"]}
    assert balancer.num_unfinished == [1, 1, 1]


def test_merged_stats_add_counts_and_average_kv_usage():
    first = SchedulerStats(2, 1, 0.5, num_steps=3, num_scheduled_tokens=40, num_prefix_queried_tokens=10)
    second = SchedulerStats(1, 0, 0.25, num_steps=2, num_scheduled_tokens=8, num_prefix_hit_tokens=4)
    merged = merge_stats([first, second])
    assert merged == SchedulerStats(
        3, 1, 0.375, num_steps=5, num_scheduled_tokens=48, num_prefix_queried_tokens=10, num_prefix_hit_tokens=4
    )
    assert merge_stats([first, second]).sleep_level is None
    asleep = [dataclasses.replace(first, sleep_level=level) for level in (0, 2)]
    assert merge_stats([second, *asleep]).sleep_level == 2


class _FakeGpu:
    def __init__(self, id: int):
        self.id = id


def test_gpu_replica_process_sees_only_its_own_devices(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda: [_FakeGpu(i) for i in range(8)])
    args = EngineArgs(tensor_parallel_size=2, data_parallel_size=3)
    assert replica_placement(args, 1) == ReplicaPlacement(1, "2,3")
    assert replica_placement(args, 2) == ReplicaPlacement(2, "4,5")
    assert replica_placement(EngineArgs(tensor_parallel_size=2), 0) == ReplicaPlacement(0, None)


def test_cpu_replica_process_picks_its_group_by_rank(model_dir):
    args = EngineArgs(model_dir, **{k: v for k, v in DP_ARGS.items() if k != "multiprocess"})
    assert replica_placement(args, 1) == ReplicaPlacement(1, None)
    config = _replica_config(args, ReplicaPlacement(1))
    assert config.parallel_config.data_parallel_rank == 1
    assert [d.id for d in make_mesh(config.parallel_config).devices.flat] == [2, 3]
