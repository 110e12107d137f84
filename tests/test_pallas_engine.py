"""The default model's greedy tokens with the Pallas GPU backend (interpret mode on CPU) equal
the reference backend's.

Interpret mode compiles each layer's two kernel launches into the step (about 20 s per
token bucket on CI's 2 cores), so both engines use one bucket, a 16-token budget: the four
prompts then run as chunked prefills mixed with decodes, the kernel's hardest case. About
30 s in all with a cold compilation cache.
"""

from vjx import LLM, SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:", "Water boils at"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
ENGINE_ARGS = dict(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=16, num_gpu_blocks_override=400)


def _greedy_tokens(attention_backend: str) -> list[list[int]]:
    llm = LLM(**ENGINE_ARGS, attention_backend=attention_backend, multiprocess=False)
    worker = llm.llm_engine.engine_core.engine_core.model_executor.worker
    assert worker.backend.name == attention_backend
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_pallas_gpu_greedy_equals_reference():
    pallas = _greedy_tokens("pallas_gpu")
    assert pallas == _greedy_tokens("reference")
    assert [len(tokens) for tokens in pallas] == [8] * len(PROMPTS)
