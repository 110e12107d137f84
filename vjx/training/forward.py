"""The engine's model as a learner's function: `trainable_model(llm)` is a copy of the model
graph with dense, differentiable attention (vjx/training/dense_attention.py) over the engine's
own param arrays, and `token_logprobs` scores whole sequences with it under `jax.grad`."""

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from vjx.attention.metadata import AttentionMetadata
from vjx.models.layers.attention import Attention
from vjx.training.dense_attention import DenseAttentionBackend


def trainable_model(llm) -> nnx.Module:
    """The model of `llm` (an in-process engine: `multiprocess=False`) with its attention
    dense and differentiable; its params are the engine's arrays until the learner changes
    them (then `llm.update_weights(nnx.to_pure_dict(nnx.state(model, nnx.Param)))`)."""
    config = llm.llm_engine.config
    if config.multiprocess:
        raise ValueError("trainable_model needs the engine in this process: create the LLM with multiprocess=False.")
    if config.lora_config is not None:
        raise ValueError("trainable_model of an engine with enable_lora is not built yet.")
    model = nnx.clone(llm.apply_model(lambda m: m)[0])
    modules = [node for _, node in nnx.iter_graph(model) if isinstance(node, nnx.Module)]
    for module in modules:
        if isinstance(module, Attention):
            module.backend = DenseAttentionBackend()
        elif hasattr(module, "backend"):
            raise ValueError(f"trainable_model supports vjx's standard attention, not {type(module).__name__}.")
    return model


def token_logprobs(model: nnx.Module, token_ids: Int[Array, "B L"]) -> Float[Array, "B L-1"]:
    """log p(token_ids[b, t + 1] | token_ids[b, :t + 1]) under `model` (float32): B sequences
    of L tokens in one step, each its own row (padding after a sequence's end changes none of
    its own positions)."""
    num_rows, length = token_ids.shape
    num_tokens = num_rows * length
    md = AttentionMetadata(
        slot_mapping=jnp.zeros(num_tokens, jnp.int32),
        query_start_loc=jnp.arange(num_rows + 1, dtype=jnp.int32) * length,
        seq_lens=jnp.full(num_rows, length, jnp.int32),
        block_tables=jnp.zeros((num_rows, 1), jnp.int32),
        num_seqs=jnp.asarray([num_rows], jnp.int32),
    )
    num_layers = len(model.model.layers)
    positions = jnp.tile(jnp.arange(length, dtype=jnp.int32), num_rows)
    caches = [jnp.zeros((0,))] * num_layers
    hidden, _ = model(token_ids.reshape(num_tokens).astype(jnp.int32), positions, caches, [md] * num_layers)
    logits = model.compute_logits(hidden).reshape(num_rows, length, -1)
    logprobs = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return jnp.take_along_axis(logprobs, token_ids[:, 1:, None], axis=-1)[..., 0]
