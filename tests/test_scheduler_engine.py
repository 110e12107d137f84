"""The scheduler under load, end to end, greedy, on the tiny stand-in for the default model
(its tokenizer, so every prompt holds as many tokens as on SmolLM2-135M-Instruct and the
pool is under the same pressure; two small layers, so the hundreds of steps stay cheap).

64 requests go through a KV pool of 48 blocks (47 usable): up to 32 run at once and need
about 64 blocks by their last tokens, so requests wait and are preempted. All must finish
with the tokens of an engine whose pool holds everything (the stand-in's shared arguments,
tests/helpers/tiny_default_model.py, so its compiled steps come from the persistent cache),
with synchronous and with async scheduling.
"""

import pytest

from tests.helpers.tiny_default_model import TINY_DEFAULT_ARGS, save_tiny_default_model
from vjx import LLM, SamplingParams

SUBJECTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "List three colors:",
    "Water boils at",
    "The largest planet in the solar system is",
    "Explain photosynthesis in one sentence.",
    "My favourite food is",
    "Q: What is 12 times 12?\nA:",
    "Translate to French: Good morning, how are you today?",
    "import numpy as np\n\ndef softmax(x):",
    "The theory of relativity was developed by",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his three children. One day,",
    "1, 2, 3, 4, 5,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
    "Repeat this sentence once more:",
    "In 1492, Christopher Columbus",
]
PROMPTS = [f"Question {i}: {SUBJECTS[i % len(SUBJECTS)]}" for i in range(64)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
NUM_GPU_BLOCKS = 48


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_default_model(tmp_path_factory.mktemp("tiny-default"))


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def tight_llm(request, model):
    # Async scheduling adds preemptions with a token in flight and stops landing while the
    # next step runs.
    engine = LLM(
        model=model,
        max_model_len=256,
        max_num_seqs=32,
        max_num_batched_tokens=64,
        num_gpu_blocks_override=NUM_GPU_BLOCKS,
        async_scheduling=request.param,
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def ample_tokens(model):
    ample_llm = LLM(model=model, **TINY_DEFAULT_ARGS, async_scheduling=False)
    outputs = ample_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert ample_llm.llm_engine.engine_core.engine_core.scheduler.num_preemptions == 0
    ample_llm.shutdown()
    return [o.outputs[0].token_ids for o in outputs]


def test_64_requests_in_48_blocks_finish_with_the_outputs_of_an_ample_pool(tight_llm, ample_tokens):
    scheduler = tight_llm.llm_engine.engine_core.engine_core.scheduler
    scheduler.make_stats()
    tight = tight_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in tight] == ["length"] * len(PROMPTS)
    stats = scheduler.make_stats()
    assert stats.num_preemptions == scheduler.num_preemptions > 0
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)
    assert stats.num_scheduled_tokens > len(PROMPTS) * GREEDY.max_tokens
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == NUM_GPU_BLOCKS - 1
    assert [o.outputs[0].token_ids for o in tight] == ample_tokens
