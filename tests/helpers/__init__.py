"""Helpers that several test modules share; test modules import from here, never from each other.

- attention_batches: random ragged paged batches and a float64 attention oracle (kernel tests)
- benchmark_model: the benchmark smoke tests' tiny Llama config.json and engine flags
- core_requests: `EngineCoreRequest`s encoded with the test tokenizer (front-end tests)
- fake_engine_core: a stand-in EngineCore with a tiny deterministic model, and `make_llm`
- large_engine: the default model's large-engine arguments (Python and CLI) and prompts
- model_steps: one request's prefill through vjx's model, outside the engine
- remote_server: `vjx serve` in a subprocess, driven over HTTP
- sampling_metadata: sampling metadata with neutral defaults and numpy references
- scheduler: a tiny scheduler, requests and hand-built runner outputs
- tiny_default_model: the default model's directory with two tiny random layers, and its engine arguments
- tiny_llama: tiny random Llama checkpoints saved by `transformers`, and `randomize_`
- tokenizer: the in-memory 300-token byte-level BPE, BOS and EOS
"""
