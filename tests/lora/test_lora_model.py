"""Multi-LoRA on vjx's model against transformers + PEFT: a tiny random Llama loaded by vjx's
real loader, PEFT adapters built and saved in the test, read by vjx's PEFT loader and written
into device slots; float32 logits of every position compared with the PEFT model's.
"""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers.families import family_config
from tests.lora.lora_models import (
    VOCAB,
    load_vjx,
    lora_step,
    run_requests,
    save_peft_adapter,
    save_tiny_llama,
    torch_logits,
)
from vjx.attention.reference import ReferenceBackend
from vjx.config import ParallelConfig
from vjx.lora.config import LoRAConfig
from vjx.lora.layers import _slot_writer, add_lora, clear_slot, write_adapter
from vjx.lora.peft_loader import LoRAAdapter, LoRAModuleWeights, load_peft_adapter
from vjx.lora.request import LoRARequest
from vjx.lora.worker_manager import LoRAManager
from vjx.models.layers.linear import FusedMergedLinear, FusedQKVLinear, Linear, MergedLinear, QKVLinear
from vjx.models.registry import get_model_class
from vjx.sharding.mesh import make_mesh

ATOL = 1e-4
MAX_LORAS = 3
MAX_LORA_RANK = 8
ALL_SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "all_seven_r8_rslora": dict(r=8, lora_alpha=16, use_rslora=True, target_modules=ALL_SEVEN),
    "qv_r4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "regex_k_o_up_r2": dict(r=2, lora_alpha=3, target_modules=r".*\.(k_proj|o_proj|up_proj)"),
}
"""Different ranks (<= MAX_LORA_RANK), alphas, targets (a list or a regex) and scalings."""
PROMPTS = [list(np.random.default_rng(i).integers(0, VOCAB, n)) for i, n in enumerate([20, 17, 9])]


@dataclasses.dataclass
class Loaded:
    model_dir: object
    hf_model: object
    base_model: object
    """vjx's model without LoRA."""
    model: object
    """vjx's model with the adapters in slots 0.. in ADAPTERS order."""
    adapters: dict
    """Adapter name -> (its directory, the PEFT model's logits of each prompt)."""
    num_compiles_while_writing: int
    """Step compiles from before the first adapter was written to after the last."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("llama")
    hf_model = save_tiny_llama(model_dir)
    model = load_vjx(model_dir)
    add_lora(model, max_loras=MAX_LORAS, max_lora_rank=MAX_LORA_RANK, dtype=jnp.float32)
    run_requests(model, [(PROMPTS[0], 0)])  # compiled with empty slots, as a runner warms up
    num_compiles = lora_step._cache_size()
    adapters = {}
    for seed, (name, lora_config) in enumerate(ADAPTERS.items()):
        adapter_dir = tmp_path_factory.mktemp(name)
        peft_model = save_peft_adapter(hf_model, adapter_dir, seed, **lora_config)
        write_adapter(model, seed, load_peft_adapter(adapter_dir, max_lora_rank=MAX_LORA_RANK))
        adapters[name] = (adapter_dir, [torch_logits(peft_model, prompt) for prompt in PROMPTS])
    run_requests(model, [(PROMPTS[0], 0)])
    num_compiles_while_writing = lora_step._cache_size() - num_compiles
    return Loaded(model_dir, hf_model, load_vjx(model_dir), model, adapters, num_compiles_while_writing)


@pytest.mark.parametrize("slot,name", list(enumerate(ADAPTERS)))
def test_adapter_logits_match_peft(setup, slot, name):
    hf_model, model = setup.hf_model, setup.model
    _, expected = setup.adapters[name]
    for prompt, want in zip(PROMPTS, expected):
        (logits,) = run_requests(model, [(prompt, slot)])
        base = torch_logits(hf_model, prompt)
        assert np.abs(want - base).max() > 0.5  # the adapter changes the logits
        np.testing.assert_allclose(logits, want, atol=ATOL, rtol=0)


def test_slot_minus_one_is_the_base_model(setup):
    hf_model, base_model, model = setup.hf_model, setup.base_model, setup.model
    for prompt in PROMPTS:
        (logits,) = run_requests(model, [(prompt, -1)])
        (base,) = run_requests(base_model, [(prompt, -1)], has_lora=False)
        np.testing.assert_allclose(logits, base, atol=1e-6, rtol=0)
        np.testing.assert_allclose(logits, torch_logits(hf_model, prompt), atol=ATOL, rtol=0)


def test_requests_on_different_adapters_share_a_step(setup):
    model, adapters = setup.model, setup.adapters
    requests = [(PROMPTS[0], 1), (PROMPTS[1], 0), (PROMPTS[2], -1)]
    together = run_requests(model, requests)
    for (prompt, slot), logits in zip(requests, together):
        (alone,) = run_requests(model, [(prompt, slot)])
        np.testing.assert_allclose(logits, alone, atol=1e-5, rtol=0)
    _, expected_1 = adapters[list(ADAPTERS)[1]]
    _, expected_0 = adapters[list(ADAPTERS)[0]]
    np.testing.assert_allclose(together[0], expected_1[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(together[1], expected_0[1], atol=ATOL, rtol=0)


def test_swapping_an_adapter_does_not_recompile(setup):
    model, adapters, names = setup.model, setup.adapters, list(ADAPTERS)
    assert setup.num_compiles_while_writing == 0
    run_requests(model, [(PROMPTS[0], 2)])
    num_steps = lora_step._cache_size()
    writer = _slot_writer(model.model.layers[0].self_attn.qkv_proj.lora.lora_a.get_value().sharding)
    num_writers = writer._cache_size()
    try:
        for slot in (2, 1):
            adapter_dir, expected = adapters[names[0]]
            write_adapter(model, slot, load_peft_adapter(adapter_dir, max_lora_rank=MAX_LORA_RANK))
            (logits,) = run_requests(model, [(PROMPTS[0], slot)])
            np.testing.assert_allclose(logits, expected[0], atol=ATOL, rtol=0)
        clear_slot(model, 2)
        (logits,) = run_requests(model, [(PROMPTS[0], 2)])
        (base,) = run_requests(model, [(PROMPTS[0], -1)])
        np.testing.assert_array_equal(logits, base)
        assert lora_step._cache_size() == num_steps
        assert writer._cache_size() == num_writers
    finally:  # the other tests' slots
        for slot in (1, 2):
            adapter_dir, _ = adapters[names[slot]]
            write_adapter(model, slot, load_peft_adapter(adapter_dir, max_lora_rank=MAX_LORA_RANK))


def test_tensor_parallel_equals_one_device(setup):
    """TP 4 over 2 KV heads: LoRA params split like their kernels, q/k/v's B with the KV heads
    repeated as the loader repeats them."""
    mesh = make_mesh(ParallelConfig(tensor_parallel_size=4))
    sharded = load_vjx(setup.model_dir, mesh)
    add_lora(sharded, max_loras=MAX_LORAS, max_lora_rank=MAX_LORA_RANK, dtype=jnp.float32)
    for slot, name in enumerate(ADAPTERS):
        write_adapter(sharded, slot, load_peft_adapter(setup.adapters[name][0], max_lora_rank=MAX_LORA_RANK))
    qkv_lora = sharded.model.layers[0].self_attn.qkv_proj.lora
    assert qkv_lora.lora_b[...].shape == (MAX_LORAS, 3 * MAX_LORA_RANK, 4, 3, 16)  # K 2 -> 4, G 2 -> 1
    assert tuple(qkv_lora.lora_b[...].sharding.spec)[2] == "model"
    requests = [(PROMPTS[0], 1), (PROMPTS[1], 0), (PROMPTS[2], 2)]
    with jax.set_mesh(mesh):
        together = run_requests(sharded, requests, mesh=mesh)
    for logits, expected in zip(together, run_requests(setup.model, requests)):
        np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)


def _rewrite_config(adapter_dir, copy_dir, **fields):
    """A copy of `adapter_dir` at `copy_dir` whose adapter_config.json has `fields` changed."""
    copy_dir.mkdir()
    (copy_dir / "adapter_model.safetensors").write_bytes((adapter_dir / "adapter_model.safetensors").read_bytes())
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    (copy_dir / "adapter_config.json").write_text(json.dumps({**config, **fields}))
    return copy_dir


def test_loader_refuses_what_vjx_cannot_serve(setup, tmp_path):
    hf_model = setup.hf_model
    adapter_dir, _ = setup.adapters["qv_r4"]
    with pytest.raises(ValueError, match=r"r \(the adapter's rank\) must be in \[1, 2\]"):
        load_peft_adapter(adapter_dir, max_lora_rank=2)
    save_peft_adapter(hf_model, tmp_path / "dora", 0, r=2, target_modules=["q_proj"], use_dora=True)
    with pytest.raises(ValueError, match="use_dora must be unset"):
        load_peft_adapter(tmp_path / "dora", max_lora_rank=8)
    save_peft_adapter(hf_model, tmp_path / "head", 0, r=2, target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match=r"target_modules holds \['lm_head'\]"):
        load_peft_adapter(tmp_path / "head", max_lora_rank=8)
    save_peft_adapter(hf_model, tmp_path / "head_regex", 0, r=2, target_modules=r".*(q_proj|lm_head)")
    with pytest.raises(ValueError, match="'base_model.model.lm_head.lora_A.weight'.*is not the lora_A"):
        load_peft_adapter(tmp_path / "head_regex", max_lora_rank=8)
    for i, (fields, message) in enumerate(
        [
            ({"bias": "all"}, "bias must be 'none'"),
            ({"modules_to_save": ["lm_head"]}, "modules_to_save must be unset"),
            ({"rank_pattern": {"q_proj": 2}}, "rank_pattern must be unset"),
        ]
    ):
        with pytest.raises(ValueError, match=message):
            load_peft_adapter(_rewrite_config(adapter_dir, tmp_path / f"config{i}", **fields), max_lora_rank=8)
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "adapter_config.json").write_text((adapter_dir / "adapter_config.json").read_text())
    with pytest.raises(ValueError, match="lacks adapter_model.safetensors"):
        load_peft_adapter(tmp_path / "no_weights", max_lora_rank=8)
    with pytest.raises(ValueError, match="lacks adapter_config.json"):
        load_peft_adapter(tmp_path, max_lora_rank=8)
    with pytest.raises(ValueError, match="lora_path must be a PEFT adapter directory"):
        load_peft_adapter(tmp_path / "missing", max_lora_rank=8)


def test_write_adapter_refuses_slots_and_shapes_that_do_not_fit(setup):
    model = setup.model
    a, b = np.zeros((2, 64), np.float32), np.zeros((64, 2), np.float32)
    with pytest.raises(ValueError, match=r"slot must be an integer in \[0, 3\)"):
        write_adapter(model, 3, LoRAAdapter(2, 1.0, {(0, "q_proj"): LoRAModuleWeights(a, b)}))
    with pytest.raises(ValueError, match="layer 2 q_proj; the model has 2 layers"):
        write_adapter(model, 0, LoRAAdapter(2, 1.0, {(2, "q_proj"): LoRAModuleWeights(a, b)}))
    with pytest.raises(ValueError, match=r"layer 0 k_proj has lora_A \(2, 64\) and lora_B \(64, 2\)"):
        write_adapter(model, 0, LoRAAdapter(2, 1.0, {(0, "k_proj"): LoRAModuleWeights(a, b)}))
    with pytest.raises(ValueError, match=r"rank must be in \[1, 8\]"):
        write_adapter(model, 0, LoRAAdapter(9, 1.0, {}))


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v2_lite", "mamba2"])
def test_add_lora_refuses_models_without_dense_blocks(family):
    hf_config = family_config(family)
    model_cls = get_model_class(hf_config, False)
    backend = ReferenceBackend()
    model = nnx.eval_shape(lambda: model_cls(hf_config, dtype=jnp.float32, backend=backend, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="dense attention \\+ gated-MLP families"):
        add_lora(model, max_loras=1, max_lora_rank=8, dtype=jnp.float32)


class _Node(nnx.Module):
    def __init__(self, **children):
        for name, child in children.items():
            setattr(self, name, child)


def _one_layer_decoder(qkv_cls, gate_up_cls) -> _Node:
    """A decoder-shaped module of one layer (D 16, N 4, K 2, H 4, F 8), random kernels."""
    model = nnx.eval_shape(lambda: _abstract_decoder(qkv_cls, gate_up_cls))
    rng = np.random.default_rng(1)
    for _, node in nnx.iter_graph(model):
        if isinstance(node, Linear):
            kernel = rng.normal(size=node.kernel.shape).astype(np.float32)
            node.kernel.set_value(jax.device_put(kernel, jax.devices()[0]))
    return model


def _abstract_decoder(qkv_cls, gate_up_cls) -> _Node:
    kwargs = dict(use_bias=False, dtype=jnp.dtype("float32"), rngs=nnx.Rngs(0))
    qkv = qkv_cls(16, 4, 2, 4, **kwargs)
    o = Linear("TNH,NHD->TD", (4, 4, 16), ("heads", "head_dim", "embed"), **kwargs)
    parts = 2 if gate_up_cls is FusedMergedLinear else ("gate_proj", "up_proj")
    gate_up = gate_up_cls(parts, 16, 8, ("embed", "mlp"), **kwargs)
    down = Linear("TF,FD->TD", (8, 16), ("mlp", "embed"), **kwargs)
    layer = _Node(self_attn=_Node(qkv_proj=qkv, o_proj=o), mlp=_Node(gate_up_proj=gate_up, down_proj=down))
    return _Node(model=_Node(layers=nnx.List([layer])))


@pytest.mark.parametrize("qkv_cls,gate_up_cls", [(QKVLinear, MergedLinear), (FusedQKVLinear, FusedMergedLinear)])
def test_packed_delta_is_the_merged_weights_delta(qkv_cls, gate_up_cls):
    """Each fused layer's LoRA output equals the delta of merging scaling * B @ A into the
    checkpoint weights and laying them out as the loader does; k_proj (not targeted) adds 0."""
    model = _one_layer_decoder(qkv_cls, gate_up_cls)
    add_lora(model, max_loras=2, max_lora_rank=4, dtype=jnp.float32)
    rng, rank, scaling = np.random.default_rng(0), 3, 0.7
    layer = model.model.layers[0]
    sites = {
        "qkv_proj": (layer.self_attn.qkv_proj, {"q_proj": 16, "k_proj": 8, "v_proj": 8}, 16),
        "o_proj": (layer.self_attn.o_proj, {"o_proj": 16}, 16),
        "gate_up_proj": (layer.mlp.gate_up_proj, {"gate_proj": 8, "up_proj": 8}, 16),
        "down_proj": (layer.mlp.down_proj, {"down_proj": 16}, 8),
    }
    weights = {
        (0, module): LoRAModuleWeights(rng.normal(size=(rank, in_width)), rng.normal(size=(out_width, rank)))
        for _, outs, in_width in sites.values()
        for module, out_width in outs.items()
        if module != "k_proj"
    }
    write_adapter(model, 1, LoRAAdapter(rank, scaling, weights))
    token_slots = np.array([1, -1, 0, 1, 1])
    model.lora_context.token_slots.set_value(jnp.asarray(token_slots, jnp.int32))
    for linear, outs, _ in sites.values():
        merged = [
            scaling * weights[0, m].lora_b @ weights[0, m].lora_a if m != "k_proj" else np.zeros((w, 16))
            for m, w in outs.items()
        ]
        is_fused = isinstance(linear, (FusedQKVLinear, FusedMergedLinear))
        delta_kernel = linear.lay_out([np.concatenate(merged)] if is_fused else merged, linear.in_shape)
        x = rng.normal(size=(5, *linear.in_shape)).astype(np.float32)
        expected = np.einsum(linear.einsum_str, x, delta_kernel)
        expected[token_slots != 1] = 0.0
        got = Linear.__call__(linear, jnp.asarray(x)) - linear.quant_method.apply(linear, jnp.asarray(x))
        np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5, rtol=0)


def test_manager_never_rereads_an_adapter_in_use(setup, tmp_path):
    """One device slot, one host place: an adapter whose request is in the runner keeps its host
    copy past max_cpu_loras, so after another adapter took its slot it is written back from host
    memory (its directory is gone by then). Removed while in use, it is listed no more but kept
    until its request has left; a pin keeps one not in use."""
    model = load_vjx(setup.model_dir)
    add_lora(model, max_loras=1, max_lora_rank=MAX_LORA_RANK, dtype=jnp.float32)
    in_use = set()
    manager = LoRAManager(model, LoRAConfig(max_loras=1, max_lora_rank=MAX_LORA_RANK, max_cpu_loras=1), in_use.copy)
    names = list(ADAPTERS)
    shutil.copytree(setup.adapters[names[1]][0], tmp_path / "copy")
    kept = LoRARequest("kept", 1, str(tmp_path / "copy"))
    other = LoRARequest("other", 2, str(setup.adapters[names[2]][0]))
    in_use.add(1)
    manager.prepare(kept)
    manager.token_slots([kept], np.zeros(1, np.int32))
    shutil.rmtree(tmp_path / "copy")
    in_use.add(2)
    manager.prepare(other)
    assert manager.token_slots([other], np.zeros(1, np.int32)).tolist() == [0]
    assert manager.token_slots([kept], np.zeros(1, np.int32)).tolist() == [0]
    (logits,) = run_requests(model, [(PROMPTS[1], 0)])
    np.testing.assert_allclose(logits, setup.adapters[names[1]][1][1], atol=ATOL, rtol=0)
    assert manager.remove_adapter(1) and manager.list_adapters() == {2}
    assert not manager.remove_adapter(1)
    in_use.clear()
    assert manager.pin_adapter(2) and not manager.add_adapter(other)
    assert manager.add_adapter(LoRARequest("third", 3, str(setup.adapters[names[0]][0])))
    assert manager.list_adapters() == {2, 3}  # the pinned one stays past max_cpu_loras
    with pytest.raises(ValueError, match="at most max_cpu_loras=1 adapters may be pinned"):
        manager.pin_adapter(3)
