"""The KV walk every attention program shares: a query tile against its row's paged keys.

Legend: T tokens, K kv heads, G query heads per kv head, H head dim, S page size, M matmul
rows of a program, L keys of one tile.

A program packs the G query heads of its kv head into the M rows of its matmuls and walks its
row's keys in tiles of L through the block table (a gather of each key's page); tiles wholly
inside the causal frontier and the sliding window run without masks. The softmax is online,
in float32, in base 2 (log2(e) folded into the scale). The launches that use it are in
ragged_paged_attention.py.

Over an fp8 cache (kv_quant.py) each loaded K/V tile is converted to the query's dtype, and
the scales are applied where they cost one multiply per row instead of one per element:
k_scale scales the tile's scores (q . (k_scale * k) = k_scale * (q . k)) and v_scale the
walk's output (a sum of p * v_scale * v), both in float32.

With attention sinks a walk starts from its row's sink instead of an empty softmax: running
max = the sink's base-2 logit, sum = exp2(0) = 1, output 0. That folds the sink, a logit with
no value, into the denominator without any work per tile.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array

from vjx.kernels.kv_quant import is_quantized

# Finite, so a fully masked row gives exp2(0) * 0 instead of inf - inf = NaN.
MASK_VALUE = -1e30
_LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class Scoring:
    """How raw q.k products become logits and which keys a query may see."""

    sm_scale: float
    sliding_window: int | None = None
    soft_cap: float | None = None

    def __post_init__(self):
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}.")
        if self.soft_cap is not None and self.soft_cap <= 0:
            raise ValueError(f"soft_cap must be > 0 or None, got {self.soft_cap}.")


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Static shapes of one launch."""

    num_kv_heads: int  # K
    group: int  # G
    head_dim: int  # H
    page_size: int  # S
    block_m: int  # M
    block_k: int  # L

    @property
    def block_q(self) -> int:
        """Query tokens per program (its M rows hold block_q tokens x G heads)."""
        return self.block_m // self.group


@dataclasses.dataclass(frozen=True)
class Walk:
    """What one program's KV walk needs: its refs, its query tile and its keys' bound."""

    kv_ref: object
    block_tables_ref: object
    row: Array
    kv_head: Array
    q: Array  # [M, H]
    positions: Array  # [M]: each query row's position in its sequence
    kv_end: Array  # keys at or past this index are not read
    geometry: Geometry
    scoring: Scoring
    kv_scales: tuple[Array, Array] | None  # (k_scale, v_scale) of an fp8 cache, else None
    sinks: Array | None  # [M]: base-2 sink logit of each row's query head, or None


def load_kv_scales(kv_ref, kv_scales_ref) -> tuple[Array, Array] | None:
    """(k_scale, v_scale) from the [2] float32 scales ref over an fp8 cache; None (the scales
    do not apply) over a cache of the compute dtype."""
    if not is_quantized(kv_ref.dtype):
        return None
    return kv_scales_ref[0], kv_scales_ref[1]


def load_sinks(sinks_ref, heads: Array, is_head: Array) -> Array | None:
    """The base-2 sink logits [M] of query heads `heads` (padding rows, not `is_head`, get 0)
    from the [N] float32 sinks ref; None without sinks."""
    if sinks_ref is None:
        return None
    return plgpu.load(sinks_ref.at[heads], mask=is_head, other=0.0) * _LOG2E


def div(a: Array, b) -> Array:
    """a // b for a >= 0 and b > 0: truncating division, which lowers to one instruction
    (floor division adds sign fix-ups to every index computation)."""
    return jax.lax.div(a, jnp.asarray(b, a.dtype))


def rem(a: Array, b) -> Array:
    """a % b for a >= 0 and b > 0."""
    return jax.lax.rem(a, jnp.asarray(b, a.dtype))


def cdiv(a: Array, b) -> Array:
    """ceil(a / b) for a >= 0 and b > 0."""
    return div(a + b - 1, b)


def dot(a: Array, b: Array, *, contract_b: int) -> Array:
    """a @ b (contract_b=0) or a @ b.T (contract_b=1), float32 accumulation; float32
    inputs use full precision (Triton's default for them is tf32)."""
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    dims = (((1,), (contract_b,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _load_kv(walk: Walk, which: int, keys: Array, key_mask: Array | None) -> Array:
    """The [L, H] keys (which=0) or values (which=1) at `keys`, gathered through the block
    table, in the query's dtype (unscaled)."""
    g = walk.geometry
    pages_ref = walk.block_tables_ref.at[walk.row, div(keys, g.page_size)]
    dims = jnp.arange(g.head_dim, dtype=jnp.int32)[None, :]
    if key_mask is None:
        page_ids = plgpu.load(pages_ref)
    else:
        page_ids = plgpu.load(pages_ref, mask=key_mask, other=0)
    index = (which, walk.kv_head, page_ids[:, None], rem(keys, g.page_size)[:, None], dims)
    if key_mask is None:
        kv = plgpu.load(walk.kv_ref.at[index])
    else:
        mask = jnp.broadcast_to(key_mask[:, None], (keys.shape[0], g.head_dim))
        # A float `other`: Triton's lowering casts no integer constant to float8.
        kv = plgpu.load(walk.kv_ref.at[index], mask=mask, other=0.0)
    return kv.astype(walk.q.dtype)


def _scores(walk: Walk, k: Array) -> Array:
    """Base-2 logits [M, L] of the query tile against one key tile."""
    s = dot(walk.q, k, contract_b=1)
    if walk.kv_scales is not None:
        s = s * walk.kv_scales[0]
    scoring = walk.scoring
    if scoring.soft_cap is None:
        return s * (scoring.sm_scale * _LOG2E)
    cap = scoring.soft_cap
    return (cap * _LOG2E) * jnp.tanh(s * (scoring.sm_scale / cap))


def _visible(walk: Walk, keys: Array) -> Array:
    """[M, L]: key inside the walk's bound, at or before the query, inside its window."""
    is_visible = (keys < walk.kv_end)[None, :] & (keys[None, :] <= walk.positions[:, None])
    window = walk.scoring.sliding_window
    if window is not None:
        is_visible &= keys[None, :] > walk.positions[:, None] - window
    return is_visible


def _tile_step(tile: Array, carry: tuple, walk: Walk, is_masked: bool) -> tuple:
    """Folds key tile `tile` into the running max m, sum l and output acc (float32)."""
    m, l, acc = carry
    block_k = walk.geometry.block_k
    keys = tile * block_k + jnp.arange(block_k, dtype=jnp.int32)
    key_mask = keys < walk.kv_end if is_masked else None
    s = _scores(walk, _load_kv(walk, 0, keys, key_mask))
    if is_masked:
        is_visible = _visible(walk, keys)
        s = jnp.where(is_visible, s, MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.exp2(s - m_new[:, None])
    if is_masked:
        p = jnp.where(is_visible, p, 0.0)
    alpha = jnp.exp2(m - m_new)
    v = _load_kv(walk, 1, keys, key_mask)
    acc = acc * alpha[:, None] + dot(p.astype(v.dtype), v, contract_b=0)
    return m_new, l * alpha + jnp.sum(p, axis=1), acc


def walk_tiles(walk: Walk, first_tile: Array, num_full: Array, end_tile: Array) -> tuple:
    """Tiles [first_tile, first_tile + num_full) unmasked, then masked up to end_tile, from
    the walk's sinks (if any) -> the running max m, sum l and output acc (float32)."""
    g = walk.geometry
    if walk.sinks is None:
        m, l = jnp.full((g.block_m,), MASK_VALUE, jnp.float32), jnp.zeros((g.block_m,), jnp.float32)
    else:
        m, l = walk.sinks, jnp.ones((g.block_m,), jnp.float32)
    carry = (m, l, jnp.zeros((g.block_m, g.head_dim), jnp.float32))
    full_end = first_tile + num_full
    step = functools.partial(_tile_step, walk=walk, is_masked=False)
    carry = jax.lax.fori_loop(first_tile, full_end, step, carry)
    step = functools.partial(_tile_step, walk=walk, is_masked=True)
    m, l, acc = jax.lax.fori_loop(full_end, jnp.maximum(end_tile, full_end), step, carry)
    if walk.kv_scales is not None:
        acc = acc * walk.kv_scales[1]
    return m, l, acc


def normalize(l: Array, acc: Array) -> Array:
    """acc / l, and 0 for rows that saw no key."""
    safe_l = jnp.where(l > 0.0, l, 1.0)
    return jnp.where((l > 0.0)[:, None], acc / safe_l[:, None], 0.0)


def head_rows(geometry: Geometry, num_rows: int) -> tuple[Array, Array]:
    """Row g of a decode tile is query head g of the kv head; rows >= G are padding."""
    g_vec = jnp.arange(num_rows, dtype=jnp.int32)
    return g_vec, g_vec < geometry.group


def full_mask(row_mask: Array, head_dim: int) -> Array:
    return jnp.broadcast_to(row_mask[:, None], (row_mask.shape[0], head_dim))
