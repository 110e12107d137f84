"""The jitted model step, its packed input layout, and the bucket set it is compiled for.

One step is `(param_leaves, kv_caches, prev_sampled, packed) -> (kv_caches, sampled)`: every
int32 input of the step travels in ONE packed buffer (floats bit-cast into it), sliced on the
device at static offsets; `kv_caches` is donated, so the cache is updated in place.
`prev_sampled` is the previous step's output, still on the device: with async scheduling a
step is planned before its predecessor's tokens reach the host, and the tokens it needs are
taken from there (`prev_sampled_index`, -1 for tokens the host knows).

Legend: T tokens (the bucket), R attention rows (`max_num_seqs`), Rs sampled rows
(`min(T, max_num_seqs)`), W block table width, V vocab.
"""

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vjx.attention.metadata import AttentionMetadata
from vjx.sampling.metadata import SamplingMetadata
from vjx.sampling.sampler import sample

_MIN_TOKEN_BUCKET = 16
_COMPILATION_CACHE_DIR = pathlib.Path.home() / ".cache" / "vjx" / "jax"


def enable_compilation_cache() -> None:
    """Turns on JAX's persistent compilation cache unless the user configured one."""
    if jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(_COMPILATION_CACHE_DIR))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """Powers of two from 16, closed by `max_num_batched_tokens` itself."""
    buckets = []
    size = _MIN_TOKEN_BUCKET
    while size < max_num_batched_tokens:
        buckets.append(size)
        size *= 2
    buckets.append(max_num_batched_tokens)
    return buckets


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """Where each field of the step lives in the packed int32 buffer (all sizes static)."""

    num_tokens: int  # T
    num_reqs: int  # R
    num_sampled: int  # Rs
    max_num_blocks_per_req: int  # W

    @functools.cached_property
    def fields(self) -> dict[str, tuple[int, int]]:
        t, r, rs = self.num_tokens, self.num_reqs, self.num_sampled
        sizes = {
            "input_ids": t,
            "prev_sampled_index": t,
            "positions": t,
            "slot_mapping": t,
            "query_start_loc": r + 1,
            "seq_lens": r,
            "num_seqs": 1,
            "logits_indices": rs,
            "temperature": rs,
            "top_k": rs,
            "top_p": rs,
            "seeds": rs,
            "sample_positions": rs,
            "block_tables": r * self.max_num_blocks_per_req,
        }
        offsets, start = {}, 0
        for name, size in sizes.items():
            offsets[name] = (start, start + size)
            start += size
        return offsets

    @property
    def size(self) -> int:
        return self.fields["block_tables"][1]

    def view(self, packed: np.ndarray, name: str) -> np.ndarray:
        """The host buffer's slice for `name` (float fields viewed as float32)."""
        start, end = self.fields[name]
        part = packed[start:end]
        if name in ("temperature", "top_p"):
            return part.view(np.float32)
        if name == "block_tables":
            return part.reshape(self.num_reqs, self.max_num_blocks_per_req)
        return part

    def unpack(self, packed: jax.Array, prev_sampled: jax.Array):
        """Device-side slices: input_ids, positions, attention and sampling metadata."""

        def get(name):
            start, end = self.fields[name]
            return packed[start:end]

        def get_float(name):
            return jax.lax.bitcast_convert_type(get(name), jnp.float32)

        md = AttentionMetadata(
            slot_mapping=get("slot_mapping"),
            query_start_loc=get("query_start_loc"),
            seq_lens=get("seq_lens"),
            block_tables=get("block_tables").reshape(self.num_reqs, self.max_num_blocks_per_req),
            num_seqs=get("num_seqs"),
        )
        sampling_md = SamplingMetadata(
            temperature=get_float("temperature"),
            top_k=get("top_k"),
            top_p=get_float("top_p"),
            seeds=get("seeds"),
            positions=get("sample_positions"),
            all_greedy=False,
        )
        prev_index = get("prev_sampled_index")
        input_ids = jnp.where(prev_index >= 0, prev_sampled[jnp.maximum(prev_index, 0)], get("input_ids"))
        return input_ids, get("positions"), md, get("logits_indices"), sampling_md


def _sample(logits, md: SamplingMetadata):
    """Skips the top-k/top-p search at run time when every row is greedy (no extra variant)."""
    greedy_md = dataclasses.replace(md, all_greedy=True)
    return jax.lax.cond(
        jnp.all(md.temperature == 0.0),
        lambda: sample(logits, greedy_md),
        lambda: sample(logits, md),
    )


def model_step(layout: StepLayout, graphdef, treedef, param_leaves, kv_caches, prev_sampled, packed):
    """Forward the step's tokens, write their KV, and sample one token per row.

    The sampled ids are padded to R rows, so every variant returns (and takes back as
    `prev_sampled`) the same shape.
    """
    input_ids, positions, md, logits_indices, sampling_md = layout.unpack(packed, prev_sampled)
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, param_leaves))
    hidden, kv_caches = model(input_ids, positions, kv_caches, md)
    logits = model.compute_logits(hidden[logits_indices])
    sampled = _sample(logits, sampling_md)
    return kv_caches, jnp.pad(sampled, (0, layout.num_reqs - layout.num_sampled))


def compile_step(layout: StepLayout, graphdef, treedef, param_leaves, kv_caches):
    """AOT-compiles the step for one layout; the result is called with real arrays."""
    fn = jax.jit(functools.partial(model_step, layout, graphdef, treedef), donate_argnums=(1,))
    structs = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        (param_leaves, kv_caches),
    )
    prev_sampled = jax.ShapeDtypeStruct((layout.num_reqs,), jnp.int32)
    packed = jax.ShapeDtypeStruct((layout.size,), jnp.int32)
    return fn.lower(*structs, prev_sampled, packed).compile()
