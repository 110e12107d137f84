"""Multi-LoRA through the real engine: a tiny random Llama and four PEFT adapters built in the
test (ranks 2 to 8, different target modules, alpha, one rsLoRA), served with max_loras=2, so
a batch that mixes the four and the base model runs in waves and adapters are swapped in and
out of the device's two slots.

- Each adapter's greedy tokens equal transformers + PEFT's (`generate`), and the base model's
  equal transformers'.
- The mixed batch gives each request the tokens it gets alone, and once it ran (the warm-up),
  nothing compiles while the requests run alone and adapters move in and out of the slots.
- The prefix cache keeps adapters apart: a prompt cached under one adapter is no hit for
  another, but is for the same one.
- A request naming a directory that is not an adapter is refused at once; one whose adapter
  fails to load (its rank over max_lora_rank) fails alone, and the engine goes on.
- At run time (vLLM's `add_lora`, `remove_lora`, `pin_lora`, `list_loras`): an adapter
  removed, its directory deleted, while its request runs next to three other adapters (more
  than max_cpu_loras) still gives that request its tokens.
"""

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest

from tests.helpers.tokenizer import make_tokenizer
from tests.lora.lora_models import VOCAB, hf_greedy, save_peft_adapter, save_tiny_llama
from vjx import LLM, SamplingParams
from vjx.lora.request import LoRARequest

NUM_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
PROMPTS = [np.random.default_rng(n).integers(2, VOCAB, 9 + 5 * n).tolist() for n in range(10)]
ADAPTERS = [
    dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
    dict(r=8, lora_alpha=16, target_modules=["gate_proj", "up_proj", "down_proj"], use_rslora=True),
    dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    dict(
        r=8, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ),
]
_compiles = {"counting": False, "count": 0}


def _count_compiles(event: str, duration: float, **kwargs) -> None:
    if _compiles["counting"] and event == "/jax/core/compile/backend_compile_duration":
        _compiles["count"] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


@dataclasses.dataclass
class Setup:
    path: str
    hf_model: object
    peft_models: list
    loras: list[LoRARequest | None]
    """Per adapter index its request; the last entry (None) is the base model."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
    root = tmp_path_factory.mktemp("lora-engine")
    hf_model = save_tiny_llama(root / "model")
    make_tokenizer().save_pretrained(root / "model")
    peft_models, loras = [], []
    for i, config in enumerate(ADAPTERS):
        peft_models.append(save_peft_adapter(hf_model, root / f"adapter{i}", seed=i + 1, **config))
        loras.append(LoRARequest(f"adapter{i}", i + 1, str(root / f"adapter{i}")))
    return Setup(str(root / "model"), hf_model, peft_models, [*loras, None])


def _tokens(outputs) -> list[list[int]]:
    return [list(output.outputs[0].token_ids) for output in outputs]


@pytest.fixture(scope="module")
def run(setup) -> dict:
    llm = LLM(
        setup.path,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
        max_cpu_loras=3,
        max_model_len=128,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        num_gpu_blocks_override=64,
        multiprocess=False,
        async_scheduling=False,
    )
    try:
        loras = [setup.loras[i % 5] for i in range(len(PROMPTS))]
        mixed = _tokens(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, lora_request=loras))
        # Running each request alone swaps the four adapters in and out of the two slots.
        _compiles.update(counting=True, count=0)
        alone = [
            _tokens(llm.generate({"prompt_token_ids": p}, GREEDY, lora_request=lora))[0]
            for p, lora in zip(PROMPTS, loras)
        ]
        _compiles["counting"] = False
        prompt = {"prompt_token_ids": PROMPTS[9]}
        cached = [llm.generate(prompt, GREEDY, lora_request=setup.loras[i])[0].num_cached_tokens for i in (0, 1, 0)]
        results = {"loras": loras, "mixed": mixed, "alone": alone, "cached": cached, "compiles": _compiles["count"]}
        results["refused"] = _refusals(llm, setup)
        results["after"] = _tokens(llm.generate({"prompt_token_ids": PROMPTS[0]}, GREEDY, lora_request=loras[0]))[0]
        results["runtime"] = _runtime_adapters(llm, setup)
        return results
    finally:
        _compiles["counting"] = False
        llm.shutdown()


def _refusals(llm: LLM, setup: Setup) -> list:
    """The refusal of a request naming no adapter directory, and the output of one whose
    adapter's rank is over max_lora_rank (its config edited on disk)."""
    messages = []
    with pytest.raises(ValueError) as refused:
        llm.generate("hi", GREEDY, lora_request=LoRARequest("nowhere", 9, setup.path + "/nowhere"))
    messages.append(str(refused.value))
    wide = setup.path + "/../adapter_wide"
    setup.peft_models[0].save_pretrained(wide)
    config = json.loads(open(wide + "/adapter_config.json").read())
    with open(wide + "/adapter_config.json", "w") as f:
        json.dump({**config, "r": 16}, f)
    (failed,) = llm.generate({"prompt_token_ids": PROMPTS[1]}, GREEDY, lora_request=LoRARequest("wide", 10, wide))
    messages.append(failed.outputs[0])
    assert not llm.llm_engine.has_unfinished_requests()
    return messages


def _runtime_adapters(llm: LLM, setup: Setup) -> dict:
    """Adds, pins, lists and removes adapters through the engine; removes one (and deletes its
    directory) while its request runs with three others. Each request's tokens by prompt index."""
    engine = llm.llm_engine
    seen = {"start": engine.list_loras()}
    seen["removed"] = [engine.remove_lora(lora_id) for lora_id in sorted(seen["start"])] + [engine.remove_lora(77)]
    seen["empty"] = engine.list_loras()
    seen["added"] = [engine.add_lora(setup.loras[2]), engine.add_lora(setup.loras[2]), engine.pin_lora(3)]
    with pytest.raises(ValueError) as unknown:
        engine.pin_lora(77)
    seen["unknown"] = str(unknown.value)
    copy = setup.path + "/../adapter1_copy"
    shutil.copytree(setup.loras[1].lora_path, copy)
    doomed = LoRARequest("doomed", 21, copy)
    seen["added"].append(engine.add_lora(doomed))
    engine.add_request("doomed", {"prompt_token_ids": PROMPTS[1]}, GREEDY, lora_request=doomed)
    engine.step()
    shutil.rmtree(copy)
    seen["removed_running"] = engine.remove_lora(21)
    seen["after_remove"] = engine.list_loras()
    for i in (0, 2, 3):
        engine.add_request(f"other{i}", {"prompt_token_ids": PROMPTS[i]}, GREEDY, lora_request=setup.loras[i])
    tokens = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = list(output.outputs[0].token_ids)
    seen["tokens"] = tokens
    seen["end"] = engine.list_loras()
    return seen


def test_each_adapter_equals_transformers_peft(setup, run):
    for i, lora in enumerate(setup.loras):
        model = setup.hf_model if lora is None else setup.peft_models[i]
        assert run["mixed"][i] == hf_greedy(model, PROMPTS[i], NUM_TOKENS), f"adapter {i}"


def test_a_mixed_batch_equals_each_request_alone(run):
    assert run["mixed"] == run["alone"]
    assert len({tuple(t) for t in run["mixed"][:5]}) == 5  # the adapters change the tokens


def test_nothing_compiles_while_adapters_change(run):
    assert run["compiles"] == 0


def test_the_prefix_cache_keeps_adapters_apart(run):
    first, other, same = run["cached"]
    assert first == 0 and other == 0
    assert same >= 48


def test_bad_adapters_fail_alone(run):
    nowhere, wide = run["refused"]
    assert "is not a PEFT adapter directory (no adapter_config.json)" in nowhere
    assert (wide.finish_reason, list(wide.token_ids)) == ("error", [])
    assert run["after"] == run["mixed"][0]


def test_adapters_load_and_unload_while_requests_run(run):
    seen = run["runtime"]
    assert seen["start"] and seen["removed"] == [True] * len(seen["start"]) + [False]
    assert seen["empty"] == set()
    assert seen["added"] == [True, False, True, True]
    assert "LoRA adapter 77 is not loaded" in seen["unknown"]
    assert seen["removed_running"] and seen["after_remove"] == {3}
    expected = {"doomed": run["mixed"][1], **{f"other{i}": run["mixed"][i] for i in (0, 2, 3)}}
    assert seen["tokens"] == expected
    assert 3 in seen["end"] and 21 not in seen["end"]
