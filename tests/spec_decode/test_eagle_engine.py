"""Speculative decoding with EAGLE-1 and EAGLE-3 heads in the published checkpoint layouts
(random weights): the outputs are the ones without speculation, and the head's first proposal
is the one a plain PyTorch forward of the head gives (the token after each position paired
with the target's hidden state there, the head's own state for the drafts after the first;
for EAGLE-3 the target's states entering three of its layers, its own LM head over a draft
vocabulary mapped to target ids)."""

import pytest
import torch
import transformers
from safetensors.torch import load_file

from tests.helpers.eagle3_reference import eagle3_reference_proposal
from tests.helpers.eagle_head import save_eagle3_head, save_eagle_head
from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx import LLM, SamplingParams

ENGINE_ARGS = dict(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32, num_gpu_blocks_override=60, seed=0)
_K = 3
_PROMPTS = [
    "one two three four one two three four one two three four one two",
    "a b c d e f a b c d e f a b c d e f a b",
    "The capital of France is",
]
_GREEDY = SamplingParams(max_tokens=40, temperature=0.0)
_SEEDED = SamplingParams(max_tokens=32, temperature=0.9, top_k=40, seed=3)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return save_tiny_default_model(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def reference(target) -> list[list[int]]:
    llm = LLM(target, **ENGINE_ARGS)
    try:
        return _token_ids(llm)
    finally:
        llm.shutdown()


def _token_ids(llm: LLM) -> list[list[int]]:
    return [
        list(o.outputs[0].token_ids)
        for params in (_GREEDY, _SEEDED)
        for o in llm.generate(_PROMPTS, params, use_tqdm=False)
    ]


def _reference_proposal(target: str, head: str, token_ids: list[int]) -> list[int]:
    """The head's k greedy drafts after `token_ids` (the last one newly drawn), by full
    forwards in PyTorch: position p reads (token p + 1, the target's last hidden state at p)."""
    target_model = transformers.LlamaForCausalLM.from_pretrained(target, attn_implementation="eager").eval()
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        hidden = target_model(ids[:, :-1], output_hidden_states=True).hidden_states[-1][0]
    config = transformers.LlamaConfig.from_pretrained(head)
    config._attn_implementation = "eager"
    head_model = transformers.LlamaModel(config).eval()
    weights = load_file(f"{head}/model.safetensors")
    head_model.load_state_dict({k: v for k, v in weights.items() if k.startswith("layers.")}, strict=False)
    head_model.layers[0].input_layernorm = torch.nn.Identity()
    head_model.norm = torch.nn.Identity()
    embed = target_model.model.embed_tokens
    inputs, drafts = torch.cat([embed(ids[0, 1:]), hidden], dim=-1) @ weights["fc.weight"].T, []
    with torch.no_grad():
        for _ in range(_K):
            out = head_model(inputs_embeds=inputs[None], position_ids=torch.arange(len(inputs))[None])
            last = out.last_hidden_state[0, -1]
            drafts.append(int(torch.argmax(embed.weight @ last)))
            pair = torch.cat([embed(torch.tensor([drafts[-1]])), last[None]], dim=-1) @ weights["fc.weight"].T
            inputs = torch.cat([inputs, pair])
    return drafts


def _run_with_head(target: str, method: str, head: str) -> tuple[list[list[int]], list[int], list[int]]:
    """The outputs with the head drafting, then a new request's first proposal and its tokens
    then (after the step that computes its prompt)."""
    speculative_config = {"method": method, "model": head, "num_speculative_tokens": _K}
    llm = LLM(target, speculative_config=speculative_config, **ENGINE_ARGS)
    try:
        token_ids = _token_ids(llm)
        assert llm.llm_engine.engine_core.engine_core.scheduler.spec_decoding_stats.num_drafts > 0
        engine = llm.llm_engine
        engine.add_request("probe", _PROMPTS[2], SamplingParams(max_tokens=100, temperature=0.0))
        engine.step()
        request = engine.engine_core.engine_core.scheduler.requests["probe"]
        return token_ids, list(request.spec_token_ids), list(request.all_token_ids)
    finally:
        llm.shutdown()


def test_eagle_outputs_are_the_ones_without_speculation(target, reference, tmp_path):
    head = save_eagle_head(tmp_path / "eagle", target)
    token_ids, proposal, probe_tokens = _run_with_head(target, "eagle", head)
    assert token_ids == reference
    assert proposal == _reference_proposal(target, head, probe_tokens)


def test_eagle3_outputs_are_the_ones_without_speculation(target, reference, tmp_path):
    head = save_eagle3_head(tmp_path / "eagle3", target)
    token_ids, proposal, probe_tokens = _run_with_head(target, "eagle3", head)
    assert token_ids == reference
    assert proposal == eagle3_reference_proposal(target, head, probe_tokens, _K)
