"""Log probabilities of chosen tokens and of each row's most likely tokens.

Legend: R rows (sampled rows, or prompt tokens for prompt logprobs), V vocab, K1 = K + 1
(the chosen token, then the top K).

vLLM v1 returns the logprobs of the RAW model logits (before penalties, temperature and
filters) by default, so the caller passes the raw logits. For prompt logprobs a row is a
prompt token and its chosen token is the next prompt token.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int


def compute_logprobs(
    logits: Float[Array, "R V"], token_ids: Int[Array, " R"], num_logprobs: int
) -> tuple[Int[Array, "R K1"], Float[Array, "R K1"], Int[Array, " R"]]:
    """(ids, logprobs, ranks) of the float32 log-softmax of `logits`.

    Column 0 of `ids`/`logprobs` is the chosen token (`token_ids`, in [0, V)); columns
    1..num_logprobs are the top tokens, most likely first (ties: lower id first). `ranks`
    is the chosen token's 1-based rank as vLLM counts it: the number of tokens whose
    logprob is >= its own, so among tied tokens it takes the last place.
    `num_logprobs` is static (a compiled shape).
    """
    if num_logprobs < 0:
        raise ValueError(f"num_logprobs must be >= 0, got {num_logprobs}.")
    logprobs_RV = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token_ids_R1 = token_ids.astype(jnp.int32)[:, None]
    chosen_R1 = jnp.take_along_axis(logprobs_RV, token_ids_R1, axis=-1)
    ranks_R = jnp.sum(logprobs_RV >= chosen_R1, axis=-1, dtype=jnp.int32)
    if num_logprobs == 0:
        return token_ids_R1, chosen_R1, ranks_R
    top_logprobs_RK, top_ids_RK = lax.top_k(logprobs_RV, num_logprobs)
    ids_RK1 = jnp.concatenate([token_ids_R1, top_ids_RK.astype(jnp.int32)], axis=-1)
    return ids_RK1, jnp.concatenate([chosen_R1, top_logprobs_RK], axis=-1), ranks_R
