"""The large engine on the default model (SmolLM2-135M-Instruct), and the prompts it runs.

Every engine-level test that needs an engine with room for all of its requests starts it
with these arguments (or their CLI form, for `vjx generate` and `vjx serve`): the same
shapes, so its compiled steps come from the persistent compilation cache.
"""

LARGE_ARGS = dict(
    max_model_len=256,
    max_num_seqs=16,
    max_num_batched_tokens=256,
    enable_chunked_prefill=False,
    num_gpu_blocks_override=400,
)
"""No chunked prefill and a KV pool that fits 16 requests of 256 tokens."""
LARGE_FLAGS = [
    "--max-model-len",
    "256",
    "--max-num-seqs",
    "16",
    "--max-num-batched-tokens",
    "256",
    "--no-enable-chunked-prefill",
    "--num-gpu-blocks-override",
    "400",
]
"""LARGE_ARGS as command-line flags."""

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "List three colors:",
    "In 1492, Christopher Columbus",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
    "The quick brown fox jumps over the lazy dog. Repeat this sentence once more:",
    "Water boils at",
    "Translate to French: Good morning, how are you today?",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his three children. Every morning the woodcutter walked into the forest "
    "with his axe, and every evening he came home tired but happy. One day,",
    "1, 2, 3, 4, 5,",
    "The largest planet in the solar system is",
    "Explain photosynthesis in one sentence.",
    "import numpy as np\n\ndef softmax(x):",
    "My favourite food is",
    "Q: What is 12 times 12?\nA:",
    "The theory of relativity was developed by",
]
"""Sixteen prompts of up to ~60 tokens: short questions, code, and long ones that a 32-token
budget chunks."""
