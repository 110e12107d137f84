"""The tiny random Llama of the benchmark smoke tests: its config.json and the engine flags
every benchmark runs it with (`load_format=dummy`, so the directory needs no weights)."""

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "dtype": "float32",
}
# Small buckets keep the engine's compile time down on CI's two cores.
ENGINE_FLAGS = [
    "--load-format",
    "dummy",
    "--max-model-len",
    "128",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "64",
    "--num-gpu-blocks-override",
    "96",
]
