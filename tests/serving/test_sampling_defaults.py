"""The server's request defaults from the generation config, as vLLM's: a field the request
leaves unset takes the generation config's value, else vLLM's default; `max_new_tokens`
is the default max_tokens, and a cap on every request when it comes from a
--generation-config directory or --override-generation-config. No engine runs: the
handlers' shared part is built on a stand-in that has only the engine's config."""

import json
import types

import pytest

from serving.protocol import ChatCompletionRequest, parse_request
from serving.server_args import ServerArgs
from serving.serving_engine import OpenAIServing
from vjx.config import ModelConfig

MAX_MODEL_LEN = 64
NUM_PROMPT_TOKENS = 10
GENERATION_CONFIG = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1, "max_new_tokens": 7}
FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens")


def _serving(model_dir, **generation) -> OpenAIServing:
    model_config = ModelConfig(
        model=str(model_dir),
        tokenizer=str(model_dir),
        hf_config=None,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        load_format="dummy",
        **generation,
    )
    config = types.SimpleNamespace(
        model_config=model_config,
        scheduler_config=types.SimpleNamespace(max_num_seqs=4),
        parallel_config=types.SimpleNamespace(data_parallel_size=1),
    )
    engine = types.SimpleNamespace(config=config, max_model_len=MAX_MODEL_LEN, get_tokenizer=lambda: None)
    return OpenAIServing(engine, None, ServerArgs(), None)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return tmp_path


def _fields(serving: OpenAIServing, **body) -> tuple:
    """The chat request's sampling parameters, as `FIELDS`."""
    body = {"messages": [{"role": "user", "content": "Hi"}], **body}
    request = parse_request(ChatCompletionRequest, json.dumps(body).encode())
    max_tokens = serving.check_lengths(NUM_PROMPT_TOKENS, request.max_tokens, "max_tokens")
    params = serving.to_sampling_params(request, max_tokens, None, None)
    return tuple(getattr(params, name) for name in FIELDS)


def test_unset_fields_take_the_generation_config_defaults(model_dir):
    serving = _serving(model_dir)
    assert _fields(serving) == (0.6, 0.9, 20, 0.0, 1.1, 7)
    # The model's own max_new_tokens is only a default: a request may ask for more.
    assert _fields(serving, temperature=0.0, top_k=5, min_p=0.1, max_tokens=30) == (0.0, 0.9, 5, 0.1, 1.1, 30)


def test_vllm_keeps_vllms_defaults(model_dir):
    serving = _serving(model_dir, generation_config="vllm")
    assert _fields(serving) == (1.0, 1.0, 0, 0.0, 1.0, MAX_MODEL_LEN - NUM_PROMPT_TOKENS)


@pytest.mark.parametrize(
    "generation, default",
    [
        (lambda model_dir: dict(generation_config=str(model_dir)), (0.6, 0.9, 20, 0.0, 1.1, 7)),
        (
            lambda _: dict(override_generation_config={"max_new_tokens": 5, "top_p": 0.5}),
            (0.6, 0.5, 20, 0.0, 1.1, 5),
        ),
    ],
    ids=["directory", "override"],
)
def test_max_new_tokens_given_to_the_server_caps_every_request(model_dir, generation, default):
    serving = _serving(model_dir, **generation(model_dir))
    assert _fields(serving) == default
    assert _fields(serving, max_tokens=30)[-1] == default[-1]
    assert _fields(serving, max_tokens=3)[-1] == 3
