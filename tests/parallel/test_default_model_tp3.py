"""The default model (SmolLM2-135M: 9 query heads, 3 KV heads) split over 3 devices gives the
greedy tokens of one device.

Three devices hold three query heads and one KV head each; the MLP width (1536) and the
vocabulary (49152) split into thirds. One 16-token bucket keeps the two compiles of the
30-layer model short; the longer prompts run as chunked prefills mixed with decodes.
"""

from jax.sharding import PartitionSpec as P

from vjx import LLM, SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:", "Water boils at 100 degrees"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
ENGINE_ARGS = dict(
    max_model_len=128,
    max_num_seqs=4,
    max_num_batched_tokens=16,
    num_gpu_blocks_override=64,
    multiprocess=False,
    async_scheduling=False,
)


def _run(tensor_parallel_size: int):
    llm = LLM(tensor_parallel_size=tensor_parallel_size, **ENGINE_ARGS)
    worker = llm.llm_engine.engine_core.engine_core.model_executor.worker
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    return tokens, worker


def test_tp3_greedy_tokens_equal_one_device():
    expected, _ = _run(1)
    tokens, worker = _run(3)
    assert tokens == expected
    assert [len(t) for t in tokens] == [GREEDY.max_tokens] * len(PROMPTS)
    attn = worker.model.model.layers[0].self_attn
    assert attn.qkv_proj.kernel[...].shape == (576, 3, 5, 64)
    assert attn.qkv_proj.kernel[...].sharding.spec == P(None, "model", None, None)
    assert {s.data.shape for s in attn.qkv_proj.kernel[...].addressable_shards} == {(576, 1, 5, 64)}
    assert worker.model_runner.kv_caches[0].sharding.spec == P(None, None, None, "model", None)
