"""Pipeline stages: which layers, params and KV caches each stage's devices hold.

The decoder's layers split into `pipeline_parallel_size` contiguous runs, the earlier stages
taking one more layer when the split is uneven (the last stage also runs the final norm, the
LM head and the sampler). The embedding lives on the first stage; the final norm and the LM
head on the last, which also holds a copy of a tied embedding. Each stage is its own mesh
(vjx/sharding/mesh.py `make_stage_meshes`), tensor parallelism inside it.
"""

import re

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EMBEDDING = "embed_tokens"


def stage_layer_ranges(num_layers: int, pipeline_parallel_size: int) -> list[range]:
    """Each stage's layers, in order."""
    if not 1 <= pipeline_parallel_size <= num_layers:
        raise ValueError(
            f"pipeline_parallel_size must be in [1, {num_layers}] (the model's layers), got {pipeline_parallel_size}."
        )
    base, extra = divmod(num_layers, pipeline_parallel_size)
    ranges, start = [], 0
    for stage in range(pipeline_parallel_size):
        end = start + base + (stage < extra)
        ranges.append(range(start, end))
        start = end
    return ranges


def param_stages(name: str, layer_ranges: list[range], is_tied: bool) -> tuple[int, ...]:
    """The stages that hold the param named `name` (a dotted module path): a layer's param
    its layer's stage; the embedding the first (and the last, when the LM head is tied to it);
    any other (final norm, LM head) the last."""
    last = len(layer_ranges) - 1
    match = _LAYER.search(name)
    if match is not None:
        layer = int(match.group(1))
        return tuple(stage for stage, layers in enumerate(layer_ranges) if layer in layers)
    if _EMBEDDING in name:
        return (0, last) if is_tied and last > 0 else (0,)
    return (last,)
