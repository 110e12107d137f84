"""generation_config.json -> default sampling parameters and extra EOS ids, as vLLM reads it.

A real `LLM` (config, tokenizer, input and output processors) on the fake engine core: the
requests the core is given show what the front end made of the defaults. That extra EOS ids
stop the real engine is tests/models/test_hub.py's.
"""

import dataclasses
import json

import pytest
import transformers

from tests.helpers.fake_engine_core import make_llm
from vjx.engine_args import EngineArgs
from vjx.models.generation_config import extra_eos_token_ids, try_get_generation_config
from vjx.sampling_params import RequestOutputKind, SamplingParams

GENERATION_CONFIG = {
    "temperature": 0.6,
    "top_p": 0.9,
    "top_k": 20,
    "repetition_penalty": 1.1,
    "max_new_tokens": 7,
    "eos_token_id": [1, 5],
    "do_sample": True,
}
DEFAULTS = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.1, max_tokens=7)


def _write_generation_config(path, config: dict) -> str:
    path.mkdir(exist_ok=True)
    (path / "generation_config.json").write_text(json.dumps(config))
    return str(path)


def _model(tmp_path, monkeypatch, **kwargs):
    model_dir = tmp_path / "model"
    _write_generation_config(model_dir, GENERATION_CONFIG)
    return make_llm(model_dir, monkeypatch, **kwargs)


def _sent_params(llm, prompt="Hello", params=None) -> SamplingParams:
    """The sampling parameters of the request `generate` gave the engine core."""
    llm.generate(prompt, params, use_tqdm=False)
    return llm.llm_engine.engine_core.added[-1].sampling_params


def test_generation_config_sets_the_default_sampling_params(tmp_path, monkeypatch):
    llm = _model(tmp_path, monkeypatch)
    assert llm.get_default_sampling_params() == DEFAULTS
    sent = _sent_params(llm)
    assert sent == dataclasses.replace(DEFAULTS, stop_token_ids=[5], output_kind=RequestOutputKind.FINAL_ONLY)


def test_extra_eos_ids_join_stop_token_ids_unless_ignore_eos(tmp_path, monkeypatch):
    llm = _model(tmp_path, monkeypatch)
    assert _sent_params(llm, params=SamplingParams(stop_token_ids=[7, 5])).stop_token_ids == [7, 5]
    assert _sent_params(llm, params=SamplingParams(stop_token_ids=[7])).stop_token_ids == [7, 5]
    assert _sent_params(llm, params=SamplingParams(stop_token_ids=[7], ignore_eos=True)).stop_token_ids == [7]
    assert llm.llm_engine.input_processor.extra_eos_token_ids == [5]


def test_vllm_keeps_vllms_defaults_and_the_extra_eos_ids(tmp_path, monkeypatch):
    llm = _model(tmp_path, monkeypatch, generation_config="vllm")
    assert llm.get_default_sampling_params() == SamplingParams()
    assert _sent_params(llm).stop_token_ids == [5]


def test_a_generation_config_directory_and_overrides(tmp_path, monkeypatch):
    other = _write_generation_config(tmp_path / "other", {"temperature": 0.3, "top_k": 4, "eos_token_id": 9})
    override = {"top_k": 3, "max_new_tokens": 2}
    llm = _model(tmp_path, monkeypatch, generation_config=other, override_generation_config=override)
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.3, top_k=3, max_tokens=2)
    assert _sent_params(llm).stop_token_ids == [9]
    only_override = _model(tmp_path, monkeypatch, generation_config="vllm", override_generation_config=override)
    assert only_override.get_default_sampling_params() == SamplingParams(top_k=3, max_tokens=2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(generation_config="/no/such/dir"), "generation_config must be 'auto', 'vllm' or a directory holding"),
        (dict(override_generation_config={"temperature": -1.0}), "generation_config sets a default .*temperature"),
    ],
)
def test_bad_generation_config_arguments(tmp_path, monkeypatch, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _model(tmp_path, monkeypatch, **kwargs)


def test_override_generation_config_must_be_a_dict(tmp_path):
    args = EngineArgs(_write_generation_config(tmp_path, GENERATION_CONFIG))
    args.override_generation_config = '{"top_k": 3}'  # past the type check of the constructor
    with pytest.raises(ValueError, match="override_generation_config must be a dict, got str"):
        args.create_engine_config()


def test_without_the_file_config_json_gives_the_eos_ids(tmp_path):
    hf_config = transformers.LlamaConfig(eos_token_id=[1, 9, 1])
    assert extra_eos_token_ids(try_get_generation_config(str(tmp_path), hf_config), 1) == [9]
    assert try_get_generation_config(str(tmp_path)) == {}
    assert extra_eos_token_ids({"eos_token_id": 1}, 1) == []
