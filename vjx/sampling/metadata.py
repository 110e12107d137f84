"""The sampling metadata of one step: a pytree of per-row device arrays and one static flag.

Legend: R sampled rows (the request bucket `Rs` of the step; padding rows of zeros are greedy).
The model runner packs these arrays into the step's one host->device transfer; every field
keeps its shape and dtype from step to step, so only `all_greedy` selects a compiled variant.
"""

import dataclasses

import jax
from jaxtyping import Array, Float, Int


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingMetadata:
    temperature: Float[Array, "R"]
    """float32; a row below 1e-5 (0 in practice) is greedy: the argmax of its raw logits."""
    top_k: Int[Array, "R"]
    """int32; keep the k largest logits (ties at the k-th kept too). 0, or k >= V, is off."""
    top_p: Float[Array, "R"]
    """float32 in (0, 1]; keep the smallest set of most likely tokens with mass >= p. 1 is off."""
    seeds: Int[Array, "R"]
    """int32; the row's request seed (its own `SamplingParams.seed`, else one from the engine)."""
    positions: Int[Array, "R"]
    """int32; output tokens the row already has. The row's key is fold_in(key(seed), position),
    so a seeded request draws the same tokens whatever batch or row it lands in."""
    all_greedy: bool = dataclasses.field(metadata=dict(static=True))
    """Static: every row is greedy, so the step compiles to a bare argmax."""
