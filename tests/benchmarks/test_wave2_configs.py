"""The Qwen3-8B and Gemma-3-12B shapes the H200 table adds (benchmarks/configs): vjx builds each
model abstractly (no weights allocated) with the parameter count of the published model."""

import pathlib

import jax
import jax.numpy as jnp
import pytest
import transformers
from flax import nnx

from vjx.attention.reference import ReferenceBackend
from vjx.models.registry import get_model_class

CONFIGS = pathlib.Path(__file__).parents[2] / "benchmarks/configs"


@pytest.mark.parametrize(("name", "billions"), [("qwen3-8b", 8.19), ("gemma-3-12b", 11.77)])
def test_vjx_builds_the_shape(name, billions):
    config = transformers.AutoConfig.from_pretrained(CONFIGS / name)
    model_cls = get_model_class(config)
    model = nnx.eval_shape(
        lambda: model_cls(config, dtype=jnp.bfloat16, backend=ReferenceBackend(), rngs=nnx.Rngs(0), max_model_len=2048)
    )
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert num_params / 1e9 == pytest.approx(billions, abs=0.01)
