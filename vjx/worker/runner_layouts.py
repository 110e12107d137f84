"""The runner's step layouts (one per token bucket) and its host buffers for them."""

from vjx.config import VjxConfig
from vjx.models.llama_eagle3 import aux_hidden_state_layer_ids
from vjx.spec_decode.config import EAGLE_METHODS
from vjx.spec_decode.sample_positions import SPEC_DECODE_INPUTS
from vjx.worker.step_inputs import LORA_INPUTS, STEP_INPUTS
from vjx.worker.step_layout import PackedBuffer, StepLayout, decode_buckets, token_buckets


def make_layouts(
    config: VjxConfig, max_blocks: int, num_kv_cache_groups: int, block_size: int, platform: str
) -> dict[int, StepLayout]:
    """One layout per token bucket of `platform`; with speculative decoding or LoRA their
    inputs join the table."""
    max_num_reqs, num_spec_tokens = config.scheduler_config.max_num_seqs, config.num_speculative_tokens
    budget = config.scheduler_config.max_num_batched_tokens
    table = STEP_INPUTS.with_inputs(*SPEC_DECODE_INPUTS) if num_spec_tokens else STEP_INPUTS
    table = table if config.lora_config is None else table.with_inputs(*LORA_INPUTS)
    is_eagle = num_spec_tokens > 0 and config.speculative_config.method in EAGLE_METHODS
    return {
        t: StepLayout(
            t,
            min(t, max_num_reqs),
            max_num_reqs,
            max_blocks,
            config.model_config.max_logprobs,
            num_kv_cache_groups,
            num_bitmask_words=-(-config.model_config.hf_text_config.vocab_size // 32),
            num_spec_tokens=num_spec_tokens,
            returns_hidden_states=is_eagle,
            block_size=block_size,
            aux_hidden_state_layers=aux_hidden_state_layers(config),
            table=table,
        )
        for t in token_buckets(budget, decode_buckets(platform, budget))
    }


def aux_hidden_state_layers(config: VjxConfig) -> tuple[int, ...]:
    """The target layers an EAGLE-3 head reads (none for other methods)."""
    spec = config.speculative_config
    if spec is None or spec.method != "eagle3":
        return ()
    num_layers = config.model_config.hf_text_config.num_hidden_layers
    return aux_hidden_state_layer_ids(spec.draft_model_config.hf_config, num_layers)


def make_buffers(config: VjxConfig, layouts: dict[int, StepLayout]) -> tuple[int, dict[int, list[PackedBuffer]]]:
    """Host buffers per bucket, used in turn, one per step in flight (at least two): the CPU
    backend may alias a numpy array it was handed, so a buffer is refilled only after the step
    that read it finished."""
    num_buffers = max(2, config.num_steps_in_flight)
    return num_buffers, {t: [PackedBuffer(layout) for _ in range(num_buffers)] for t, layout in layouts.items()}
