"""`speculative_config` as vLLM takes it (a dict, or JSON on the command line), checked and
turned into `SpeculativeConfig`.

The method comes from `method`, or from `model` as vLLM infers it ("ngram" / "[ngram]" is the
n-gram proposer; any other model a draft model). vLLM's other keys are refused by name while
they are not built, as are unknown keys.
"""

import dataclasses
from typing import Any

import transformers

from vjx.config import ModelConfig, SpeculativeConfig
from vjx.models.llama_eagle3 import verify_eagle3_head

BUILT_METHODS = ("ngram", "draft_model", "eagle", "eagle3")
EAGLE_METHODS = ("eagle", "eagle3")
"""Methods whose draft is a head on the target's hidden states, not a model of its own."""
_HEAD_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "Eagle3LlamaForCausalLM"}
NOT_BUILT_METHODS = (
    "mtp",
    "medusa",
    "mlp_speculator",
    "suffix",
    "ngram_gpu",
    "custom_class",
    "dflash",
    "dspark",
    "extract_hidden_states",
)
MAX_SPECULATIVE_TOKENS = 16
"""Drafts per request and step: the step compiles one sampling position per draft."""
_BUILT_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
_NEUTRAL_KEYS = {"enforce_eager": (None, False, True), "disable_padded_drafter_batch": (False,)}
"""Keys whose values have no meaning here (XLA compiles every step; no drafter batch)."""
_NOT_BUILT_KEYS = (
    "draft_tensor_parallel_size",
    "tensor_parallel_size",
    "quantization",
    "moe_backend",
    "attention_backend",
    "kv_cache_dtype",
    "max_model_len",
    "revision",
    "code_revision",
    "num_speculative_tokens_per_batch_size",
    "speculative_token_tree",
    "parallel_drafting",
    "rejection_sample_method",
    "draft_sample_method",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
    "enable_adaptive_verification",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
)


def _method(config: dict[str, Any]) -> str:
    method, model = config.get("method"), config.get("model")
    if method is None:
        method = "ngram" if model in ("ngram", "[ngram]") else "draft_model"
    method = "ngram" if method == "[ngram]" else method
    if method in NOT_BUILT_METHODS:
        raise ValueError(
            f"speculative_config method={method!r} is not built yet; the methods built are {list(BUILT_METHODS)}."
        )
    if method not in BUILT_METHODS:
        raise ValueError(
            f"speculative_config method must be one of {list(BUILT_METHODS + NOT_BUILT_METHODS)}, got {method!r}."
        )
    return method


def _verify_keys(config: dict[str, Any]) -> None:
    for key, value in config.items():
        if key in _BUILT_KEYS or (key in _NEUTRAL_KEYS and value in _NEUTRAL_KEYS[key]):
            continue
        if key in _NOT_BUILT_KEYS or key in _NEUTRAL_KEYS:
            raise ValueError(f"speculative_config key {key!r} is not supported by vjx yet; leave it out.")
        raise ValueError(f"speculative_config has an unknown key {key!r}; vjx takes {list(_BUILT_KEYS)}.")


def _lookup_range(config: dict[str, Any]) -> tuple[int, int]:
    """(prompt_lookup_min, prompt_lookup_max) with vLLM's defaults: 5 and 5, or the one given."""
    low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
    low, high = (5, 5) if low is None and high is None else (low or high, high or low)
    for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"speculative_config {name} must be an integer >= 1, got {value!r}.")
    if low > high:
        raise ValueError(f"speculative_config prompt_lookup_min={low} must be <= prompt_lookup_max={high}.")
    return low, high


def create_speculative_config(config: dict[str, Any] | None) -> SpeculativeConfig | None:
    """The checked config; None for None or an empty dict (no speculative decoding)."""
    if not config:
        return None
    if not isinstance(config, dict):
        raise ValueError(f"speculative_config must be a dict (JSON object), got {type(config).__name__}.")
    _verify_keys(config)
    method = _method(config)
    k = config.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(
            f"speculative_config num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], got {k!r}."
        )
    if method in ("draft_model", *EAGLE_METHODS):
        if not isinstance(config.get("model"), str) or not config["model"]:
            raise ValueError(f"speculative_config method={method!r} needs model: the draft model's directory or id.")
        return SpeculativeConfig(method, k)
    low, high = _lookup_range(config)
    return SpeculativeConfig(method, k, low, high)


def merge_spec_shorthands(
    config: dict[str, Any] | None, spec_method: str | None, spec_model: str | None, spec_tokens: int | None
) -> dict[str, Any] | None:
    """`speculative_config` with vLLM's --spec-method / --spec-model / --spec-tokens merged in
    (each may not repeat a key the dict has), keys with dashes spelled with underscores."""
    merged = None if config is None else dict(config)
    for name, key, value in (
        ("spec_method", "method", spec_method),
        ("spec_model", "model", spec_model),
        ("spec_tokens", "num_speculative_tokens", spec_tokens),
    ):
        if value is None:
            continue
        merged = {} if merged is None else merged
        if key in merged:
            raise ValueError(f"{name} and speculative_config[{key!r}] are mutually exclusive.")
        merged[key] = value
    return merged if merged is None else {key.replace("-", "_"): value for key, value in merged.items()}


def with_draft_model(config: SpeculativeConfig, draft_dir: str, target: ModelConfig) -> SpeculativeConfig:
    """`config` with its draft model's (or EAGLE head's) config: the target's dtype, lengths and
    load format, the draft's architecture; its vocabulary must be the target's (drafts are
    target token ids)."""
    hf_config = transformers.AutoConfig.from_pretrained(draft_dir)
    draft_vocab, target_vocab = hf_config.get_text_config().vocab_size, target.hf_text_config.vocab_size
    if draft_vocab != target_vocab:
        raise ValueError(
            f"speculative_config model {draft_dir!r} has a vocabulary of {draft_vocab} tokens; the target's has "
            f"{target_vocab}: a draft model must share the target's tokenizer."
        )
    if config.method in EAGLE_METHODS:
        _verify_eagle_head(hf_config, target)
        if config.method == "eagle3":
            verify_eagle3_head(hf_config, target.hf_text_config.num_hidden_layers)
        # The head's checkpoint names a Llama (or its own class); the method says which head it is.
        hf_config.architectures = [_HEAD_ARCHITECTURES[config.method]]
    draft = dataclasses.replace(target, model=draft_dir, hf_config=hf_config, quantization=None)
    return dataclasses.replace(config, draft_model_config=draft)


def _verify_eagle_head(hf_config, target: ModelConfig) -> None:
    """An EAGLE head reads the target's embeddings and hidden states: their width must be its."""
    width = target.hf_text_config.hidden_size
    for key in ("hidden_size", "target_hidden_size"):
        value = getattr(hf_config, key, None)
        if value is not None and value != width:
            raise ValueError(
                f"speculative_config EAGLE head has {key} {value}; the target's is {width}: the head must be "
                "trained for this target."
            )
