"""Hugging Face Hub model ids, resolved offline from a hub cache written by the test (no test
reaches the network), and one engine that runs a Hub model.

The cache holds `org/tiny` at two commits: MAIN (`refs/main`), a tiny random Llama whose
generation_config.json lists a second EOS id, the token its greedy run emits at step
`STOP_STEP`; and V2 (`refs/v2`), the same files but a config.json of a shorter context.
"""

import json
import os
import pathlib
import subprocess
import sys

import huggingface_hub
import pytest
import torch

from tests.helpers.hub_cache import add_snapshot
from tests.helpers.tiny_llama import ENGINE_ARGS, PROMPTS, save_tiny_llama
from vjx import LLM, EngineArgs, SamplingParams
from vjx.models import hub

REPO = "org/tiny"
MAIN = "a" * 40
V2 = "b" * 40
V2_CONTEXT = 96
PROMPT = PROMPTS[1]
NUM_TOKENS = 12
STOP_STEP = 5
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def offline():
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: its constant is what it checks.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


def _hf_greedy(hf_model, prompt_ids: list[int]) -> list[int]:
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(NUM_TOKENS):
            ids.append(int(hf_model(torch.as_tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def _write_model_files(path: pathlib.Path) -> tuple[list[int], int]:
    """The tiny Llama with a generation config that stops its greedy run at STOP_STEP;
    returns the greedy tokens (without that stop) and the stop id."""
    hf_model = save_tiny_llama(path, num_kv_heads=2, seed=2)
    tokens = _hf_greedy(hf_model, PROMPT["prompt_token_ids"])
    stop_id = tokens[STOP_STEP]
    assert stop_id not in tokens[:STOP_STEP] + [0, 1], tokens  # a first, non-special token
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [1, stop_id]}))
    return tokens, stop_id


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    files = tmp_path_factory.mktemp("tiny")
    tokens, stop_id = _write_model_files(files)
    cache = tmp_path_factory.mktemp("hub")
    main_dir = add_snapshot(cache, REPO, files, MAIN, "main")
    config = json.loads((files / "config.json").read_text())
    (files / "config.json").write_text(json.dumps({**config, "max_position_embeddings": V2_CONTEXT}))
    v2_dir = add_snapshot(cache, REPO, files, V2, "v2")
    return dict(cache=str(cache), main=main_dir, v2=v2_dir, files=str(files), tokens=tokens, stop_id=stop_id)


@pytest.mark.parametrize(
    "revision, snapshot", [(None, "main"), ("main", "main"), (MAIN, "main"), ("v2", "v2"), (V2, "v2")]
)
def test_revisions_resolve_to_their_snapshots(hub_cache, revision, snapshot):
    path = hub.download_model(REPO, revision, hub_cache["cache"])
    assert path == hub_cache[snapshot]
    assert os.path.isfile(os.path.join(path, "model.safetensors"))


def test_revision_and_tokenizer_revision_pick_the_snapshots(hub_cache):
    def dirs(**kwargs):
        config = EngineArgs(REPO, download_dir=hub_cache["cache"], **kwargs).create_engine_config().model_config
        return config.model, config.tokenizer, config.hf_config.max_position_embeddings

    assert dirs() == (hub_cache["main"], hub_cache["main"], 128)
    assert dirs(revision="v2") == (hub_cache["v2"], hub_cache["v2"], V2_CONTEXT)
    assert dirs(tokenizer_revision=V2) == (hub_cache["main"], hub_cache["v2"], 128)
    local = EngineArgs(hub_cache["main"], tokenizer=REPO, tokenizer_revision="v2", download_dir=hub_cache["cache"])
    assert local.create_engine_config().model_config.tokenizer == hub_cache["v2"]


@pytest.mark.parametrize(
    "model, revision, message",
    [
        ("org/missing", None, r"model 'org/missing' \(revision 'main'\) is not in the Hugging Face cache .* offline"),
        (REPO, "v3", r"model 'org/tiny' \(revision 'v3'\) is not in the Hugging Face cache .* offline"),
        ("/no/such/dir", None, r"model must be a model directory or a Hugging Face Hub model id like 'org/name'"),
        ("not a/valid id", None, r"got 'not a/valid id': no such directory, and not a valid model id"),
    ],
)
def test_unresolvable_models_are_clear_errors(hub_cache, model, revision, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(model, revision=revision, download_dir=hub_cache["cache"]).create_engine_config()


def test_missing_tokenizer_is_named(hub_cache):
    with pytest.raises(ValueError, match=r"tokenizer 'org/no-tokenizer' \(revision 'main'\) is not in the"):
        EngineArgs(
            hub_cache["main"], tokenizer="org/no-tokenizer", download_dir=hub_cache["cache"]
        ).create_engine_config()


def test_hf_home_locates_the_cache_in_a_fresh_process(hub_cache, tmp_path):
    """huggingface_hub reads HF_HOME at import, so a new process sees it: no download_dir."""
    snapshot = add_snapshot(tmp_path / "hub", REPO, hub_cache["main"], MAIN, "main")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    env.update(HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    code = "from vjx.models import hub; print(hub.download_model('org/tiny', None, None))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == snapshot


@pytest.fixture(scope="module")
def hub_llm(hub_cache):
    return LLM(REPO, download_dir=hub_cache["cache"], **ENGINE_ARGS)


def test_hub_model_runs_from_its_snapshot(hub_llm, hub_cache):
    """The greedy tokens are transformers' (float32, O(1) logits: no near ties to flip)."""
    assert hub_llm.llm_engine.config.model_config.model == hub_cache["main"]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    completion = hub_llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert completion.token_ids == hub_cache["tokens"]
    assert completion.finish_reason == "length"


def test_generation_config_eos_ids_stop_like_stop_token_ids(hub_llm, hub_cache):
    stop_id, tokens = hub_cache["stop_id"], hub_cache["tokens"]
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS)
    stopped, shortened = hub_llm.generate(
        [PROMPT, PROMPT], [greedy, SamplingParams(temperature=0.0, max_tokens=STOP_STEP)], use_tqdm=False
    )
    completion = stopped.outputs[0]
    assert completion.token_ids == tokens[: STOP_STEP + 1]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_id)
    assert completion.text == shortened.outputs[0].text  # the stop token's text is left out
    assert hub_llm.get_default_sampling_params() == SamplingParams()
