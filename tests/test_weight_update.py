"""New weights for a running engine (`LLM.update_weights`, `get_weights`, `reload_weights`), as
an RL loop swaps them between rollouts: two tiny random Llamas A and B, transformers the oracle.

- Weights by Hugging Face name (B's state dict, torch-made numpy arrays) make the engine give
  B's greedy tokens; `get_weights()`'s own pytree (device arrays) puts A back; a directory of
  safetensors (`reload_weights`) gives B again. None of it compiles anything.
- By default the prefix cache is reset (its KV came from the old weights);
  `reset_prefix_cache=False` keeps it.
- A subset of the params may be given, in another dtype (cast to the model's); an unknown
  path or name, a wrong shape or a fused q/k/v missing a part is refused, and the engine keeps
  its weights.
- `save_weights` writes an Orbax checkpoint that `load_format="orbax"` restores on one device
  and over four (tensor parallelism 4: the model has 4 KV heads, so none is repeated), with the
  same tokens; the Hugging Face conversion is skipped.
"""

import jax
import numpy as np
import pytest

from tests.helpers.tiny_llama import ENGINE_ARGS, save_tiny_llama
from tests.lora.lora_models import hf_greedy
from vjx import LLM, SamplingParams
from vjx.models.orbax_checkpoint import _param_path

NUM_TOKENS = 8
NUM_KV_HEADS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
PROMPTS = [np.random.default_rng(n).integers(3, 250, 20 + 3 * n).tolist() for n in range(3)]
_compiles = {"counting": False, "count": 0}


def _count_compiles(event: str, duration: float, **kwargs) -> None:
    if _compiles["counting"] and event == "/jax/core/compile/backend_compile_duration":
        _compiles["count"] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def _greedy(llm: LLM) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _cached(llm: LLM) -> int:
    return llm.generate({"prompt_token_ids": PROMPTS[2]}, GREEDY, use_tqdm=False)[0].num_cached_tokens


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("weights")
    model_a = save_tiny_llama(root / "a", NUM_KV_HEADS, seed=1)
    model_b = save_tiny_llama(root / "b", NUM_KV_HEADS, seed=2)
    seen = {
        "expected": {
            name: [hf_greedy(m, p, NUM_TOKENS) for p in PROMPTS] for name, m in (("a", model_a), ("b", model_b))
        }
    }
    llm = LLM(str(root / "a"), **ENGINE_ARGS)
    try:
        seen["a"] = _greedy(llm)
        original = llm.get_weights()
        seen["shapes"] = jax.tree.map(lambda x: x.shape, original)
        _compiles.update(counting=True, count=0)
        llm.update_weights({name: t.detach().numpy() for name, t in model_b.state_dict().items()})
        seen["cached_after_update"] = _cached(llm)
        seen["b_by_name"] = _greedy(llm)
        llm.update_weights(original, reset_prefix_cache=False)
        seen["cached_kept"] = _cached(llm)
        llm.llm_engine.reset_prefix_cache()
        seen["a_by_tree"] = _greedy(llm)
        llm.reload_weights(str(root / "b"))
        seen["b_by_reload"] = _greedy(llm)
        llm.save_weights(str(root / "saved"))
        seen["saved"] = str(root / "saved")
        seen["compiles"] = _compiles["count"]
        _compiles["counting"] = False
        seen["refusals"] = _refusals(llm, original, model_b)
        seen["after_refusals"] = _greedy(llm)
        norm = original["model"]["norm"]["weight"]
        llm.update_weights({"model": {"norm": {"weight": np.asarray(norm, np.float64) * 2}}})
        seen["norm"] = llm.get_weights()["model"]["norm"]["weight"]
        seen["norm_expected"] = np.asarray(norm) * 2
        return seen
    finally:
        _compiles["counting"] = False
        llm.shutdown()


def _refusals(llm: LLM, original: dict, model_b) -> list[str]:
    state = {name: t.detach().numpy() for name, t in model_b.state_dict().items()}
    bad = [
        {"model": {"nowhere": np.zeros(3)}},
        {"model": {"norm": {"weight": np.zeros(3)}}},
        {"model.layers.0.self_attn.nowhere.weight": np.zeros(3)},
        {"model.layers.0.self_attn.q_proj.weight": state["model.layers.0.self_attn.q_proj.weight"]},
    ]
    messages = []
    for weights in bad:
        with pytest.raises(ValueError) as refused:
            llm.update_weights(weights)
        messages.append(str(refused.value))
    return messages


def test_weights_by_name_by_tree_and_by_directory(run):
    assert run["a"] == run["expected"]["a"]
    assert run["b_by_name"] == run["expected"]["b"] != run["a"]
    assert run["a_by_tree"] == run["expected"]["a"]
    assert run["b_by_reload"] == run["expected"]["b"]


def test_nothing_compiles(run):
    assert run["compiles"] == 0


def test_the_prefix_cache_resets_unless_told_not_to(run):
    assert run["cached_after_update"] == 0
    assert run["cached_kept"] >= 16


def test_get_weights_is_vjx_layout(run):
    shapes = run["shapes"]
    assert set(shapes) == {"model", "lm_head"}
    assert "qkv_proj" in shapes["model"]["layers"][0]["self_attn"]
    assert "lora" not in str(shapes)


def test_bad_weights_are_refused_and_change_nothing(run):
    nowhere, wrong_shape, unknown_name, partial = run["refusals"]
    assert "model.nowhere is no param of the model" in nowhere
    assert "model.norm.weight has shape (3,)" in wrong_shape
    assert "'model.layers.0.self_attn.nowhere.weight' matches no param" in unknown_name
    assert "missing" in partial and "k_proj" in partial
    assert run["after_refusals"] == run["expected"]["b"]


def test_a_subset_in_another_dtype_is_cast(run):
    assert run["norm"].dtype == run["norm_expected"].dtype
    np.testing.assert_allclose(np.asarray(run["norm"]), run["norm_expected"])


@pytest.mark.parametrize("tensor_parallel_size", [1, 4])
def test_orbax_round_trip(run, tensor_parallel_size):
    llm = LLM(run["saved"], load_format="orbax", tensor_parallel_size=tensor_parallel_size, **ENGINE_ARGS)
    try:
        assert _greedy(llm) == run["expected"]["b"]
    finally:
        llm.shutdown()


def test_a_training_state_maps_onto_param_paths():
    keys = [jax.tree_util.DictKey(k) for k in ("model", "layers", "0", "mlp", "down_proj", "kernel", "value")]
    assert _param_path(keys) == ("model", "layers", 0, "mlp", "down_proj", "kernel")
