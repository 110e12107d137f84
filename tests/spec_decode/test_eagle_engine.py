"""Speculative decoding with an EAGLE-1 head in the published checkpoint layout (random
weights): the outputs are the ones without speculation, and the head's first proposal is the
one a plain PyTorch forward of the head gives (the token after each position paired with the
target's hidden state there, the head's own state for the drafts after the first)."""

import pytest
import torch
import transformers
from safetensors.torch import load_file

from tests.helpers.eagle_head import save_eagle_head
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
def models(tmp_path_factory) -> tuple[str, str]:
    target = save_tiny_default_model(tmp_path_factory.mktemp("target"))
    return target, save_eagle_head(tmp_path_factory.mktemp("eagle"), target)


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


def test_outputs_are_the_ones_without_speculation(models):
    target, head = models
    llm = LLM(target, **ENGINE_ARGS)
    try:
        reference = _token_ids(llm)
    finally:
        llm.shutdown()
    llm = LLM(
        target, speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": _K}, **ENGINE_ARGS
    )
    try:
        assert _token_ids(llm) == reference
        stats = llm.llm_engine.engine_core.engine_core.scheduler.spec_decoding_stats
        assert stats.num_drafts > 0
        # The first proposal of a new request, after the step that computes its prompt.
        engine = llm.llm_engine
        engine.add_request("probe", _PROMPTS[2], SamplingParams(max_tokens=100, temperature=0.0))
        engine.step()
        request = engine.engine_core.engine_core.scheduler.requests["probe"]
        proposal = list(request.spec_token_ids)
        token_ids = list(request.all_token_ids)
    finally:
        llm.shutdown()
    assert proposal == _reference_proposal(target, head, token_ids)
