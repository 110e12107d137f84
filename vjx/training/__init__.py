"""vjx inside a JAX training loop: the engine's model as a differentiable function of its
params (`trainable_model`, `token_logprobs`), for a learner that hands its new params back
with `LLM.update_weights`."""

from vjx.training.dense_attention import DenseAttentionBackend
from vjx.training.forward import token_logprobs, trainable_model

__all__ = ["DenseAttentionBackend", "token_logprobs", "trainable_model"]
