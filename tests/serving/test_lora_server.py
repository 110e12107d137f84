"""Multi-LoRA through `vjx serve`, driven with the official `openai` client and raw HTTP: a
tiny random Llama and two PEFT adapters built in the test, one served from `--lora-modules`,
the other loaded at run time from under `--allowed-lora-dir`, behind an API key.

- /v1/models lists the base model and the adapters (their path as `root`, the base as
  `parent`); a completion naming an adapter gives transformers + PEFT's greedy tokens and
  carries the adapter's name as its `model`.
- The runtime routes refuse a path outside the allowed directory, a directory that is no
  adapter, a name already loaded and a client without the key.
- An adapter unloaded while its streamed completion runs finishes that completion with the
  tokens it gets alone; after that its name is a 404.
- `load_inplace` puts new weights under a served name: the same prompt then gives the new
  adapter's tokens, not blocks the prefix cache kept from the old one.
"""

import json
import shutil
import signal

import numpy as np
import openai
import pytest

from tests.helpers.remote_server import RemoteServer
from tests.helpers.tokenizer import make_tokenizer
from tests.lora.lora_models import VOCAB, hf_greedy, save_peft_adapter, save_tiny_llama

API_KEY = "lora-key"
NUM_TOKENS = 12
LONG = 80
"""A completion that runs on for a while after its first chunk."""
PROMPT = np.random.default_rng(0).integers(2, VOCAB, 40).tolist()
"""Long enough to fill two 16-token blocks: the prefix cache holds them after a request."""
ALPHA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
BETA = dict(r=8, lora_alpha=16, target_modules=["gate_proj", "up_proj", "down_proj"])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    hf_model = save_tiny_llama(root / "model")
    make_tokenizer().save_pretrained(root / "model")
    allowed = root / "allowed"
    alpha = save_peft_adapter(hf_model, allowed / "alpha", seed=1, **ALPHA)
    beta = save_peft_adapter(hf_model, allowed / "beta", seed=2, **BETA)
    (allowed / "not_an_adapter").mkdir()
    shutil.copytree(allowed / "beta", root / "outside")
    expected = {name: hf_greedy(model, PROMPT, NUM_TOKENS) for name, model in (("alpha", alpha), ("beta", beta))}
    expected["tiny"] = hf_greedy(hf_model, PROMPT, NUM_TOKENS)
    return root, expected


@pytest.fixture(scope="module")
def server(setup):
    root, _ = setup
    flags = ["--served-model-name", "tiny", "--max-model-len", "128", "--enable-lora", "--max-loras", "2"]
    flags += ["--max-lora-rank", "8", "--lora-modules", f"alpha={root / 'allowed' / 'alpha'}"]
    flags += ["--allowed-lora-dir", str(root / "allowed"), "--api-key", API_KEY]
    remote = RemoteServer([str(root / "model"), *flags], api_key=API_KEY)
    yield remote
    remote.stop(signal.SIGKILL)


def _greedy(server, model: str, max_tokens: int = NUM_TOKENS) -> tuple[str, list[int]]:
    completion = server.client().completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    return completion.model, completion.choices[0].model_extra["token_ids"]


def _post(server, path: str, body: dict, **kwargs) -> tuple[int, str]:
    status, text = server.request("POST", path, body, **kwargs)
    return status, text.decode()


def test_static_adapter_is_a_model_with_peft_tokens(server, setup):
    root, expected = setup
    cards = {card.id: card for card in server.client().models.list().data}
    assert set(cards) == {"tiny", "alpha"}
    assert cards["alpha"].model_extra["parent"] == "tiny"
    assert cards["alpha"].model_extra["root"] == str(root / "allowed" / "alpha")
    assert _greedy(server, "alpha") == ("alpha", expected["alpha"])
    assert _greedy(server, "tiny") == ("tiny", expected["tiny"])
    with pytest.raises(openai.NotFoundError):
        _greedy(server, "beta")


def test_runtime_routes_refuse_what_they_must(server, setup):
    root, _ = setup
    status, body = _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(root / "outside")})
    assert status == 400 and json.loads(body)["error"]["param"] == "lora_path"
    assert "--allowed-lora-dir" in body
    status, body = _post(
        server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(root / "allowed" / "not_an_adapter")}
    )
    assert status == 404 and "no adapter_config.json" in body
    status, body = _post(
        server, "/v1/load_lora_adapter", {"lora_name": "alpha", "lora_path": str(root / "allowed" / "beta")}
    )
    assert status == 400 and "The lora adapter 'alpha' has already been loaded." in body
    status, body = _post(server, "/v1/load_lora_adapter", {"lora_name": "tiny", "lora_path": str(root / "allowed")})
    assert status == 400 and "is the base model's name" in body
    body = {"lora_name": "x", "lora_path": str(root / "allowed" / "beta")}
    assert _post(server, "/v1/load_lora_adapter", body, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "nope"})[0] == 404
    assert _post(server, "/v1/unload_lora_adapter", {})[0] == 400
    assert {card.id for card in server.client().models.list().data} == {"tiny", "alpha"}


def test_unload_while_its_completion_streams(server, setup):
    root, expected = setup
    status, body = _post(
        server, "/v1/load_lora_adapter", {"lora_name": "beta", "lora_path": str(root / "allowed/beta")}
    )
    assert (status, body) == (200, "Success: LoRA adapter 'beta' added successfully.")
    assert _greedy(server, "beta") == ("beta", expected["beta"])
    _, alone = _greedy(server, "beta", max_tokens=LONG)
    stream = server.client().completions.create(
        model="beta",
        prompt=PROMPT,
        max_tokens=LONG,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    chunks = iter(stream)
    first = next(chunks)
    unloaded = _post(server, "/v1/unload_lora_adapter", {"lora_name": "beta"})
    still_running = server.metrics()["vjx:num_requests_running"]
    token_ids = [t for chunk in [first, *chunks] for t in chunk.choices[0].model_extra["token_ids"]]
    assert unloaded == (200, "Success: LoRA adapter 'beta' removed successfully.")
    assert still_running == 1, "the completion ran on after the unload"
    assert first.model == "beta" and token_ids == alone
    with pytest.raises(openai.NotFoundError):
        _greedy(server, "beta")
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "beta"})[0] == 404


def test_load_inplace_replaces_the_weights_and_their_cached_blocks(server, setup):
    root, expected = setup
    body = {"lora_name": "alpha", "lora_path": str(root / "allowed" / "beta"), "load_inplace": True}
    assert _post(server, "/v1/load_lora_adapter", body)[0] == 200
    assert _greedy(server, "alpha") == ("alpha", expected["beta"])
    assert {card.id for card in server.client().models.list().data} == {"tiny", "alpha"}
