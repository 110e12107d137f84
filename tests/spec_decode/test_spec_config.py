"""`speculative_config` as vLLM takes it: keys, defaults, the --spec-* shorthands, the JSON
flag, and a clear ValueError for every method, key or combination not built."""

import json

import pytest
import transformers

from serving.cli import _parse_args
from tests.helpers.eagle_head import save_eagle3_head
from tests.helpers.tiny_default_model import save_tiny_default_model
from vjx.config import SpeculativeConfig
from vjx.engine_args import EngineArgs
from vjx.models.llama_eagle3 import aux_hidden_state_layer_ids
from vjx.spec_decode.config import create_speculative_config


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"method": "ngram", "num_speculative_tokens": 4}, SpeculativeConfig("ngram", 4, 5, 5)),
        (
            {"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
            SpeculativeConfig("ngram", 2, 3, 3),
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
            SpeculativeConfig("ngram", 2, 2, 4),
        ),
        ({"method": "ngram", "num_speculative_tokens": 1, "enforce_eager": True}, SpeculativeConfig("ngram", 1, 5, 5)),
        (None, None),
        ({}, None),
        ({"model": "org/draft", "num_speculative_tokens": 3}, SpeculativeConfig("draft_model", 3)),
        ({"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3}, SpeculativeConfig("eagle3", 3)),
    ],
)
def test_vllm_keys_and_defaults(config, expected):
    assert create_speculative_config(config) == expected


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"method": "mtp", "model": "x", "num_speculative_tokens": 2}, "method='mtp' is not built yet"),
        ({"method": "eagle3", "num_speculative_tokens": 2}, "method='eagle3' needs model"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "method='draft_model' needs model"),
        ({"method": "bogus", "num_speculative_tokens": 2}, "method must be one of"),
        ({"method": "ngram"}, r"num_speculative_tokens must be an integer in \[1, 16\], got None"),
        ({"method": "ngram", "num_speculative_tokens": 17}, r"in \[1, 16\], got 17"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min must be"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min=4 must be <= prompt_lookup_max=2",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}, "not supported by vjx"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 2}, "unknown key 'lookahead'"),
    ],
)
def test_what_is_not_built_is_refused_by_name(config, message):
    with pytest.raises(ValueError, match=message):
        create_speculative_config(config)


def test_engine_args_merge_the_shorthands_and_refuse_what_cannot_run_with_drafts():
    args = EngineArgs(spec_method="ngram", spec_tokens=3)
    assert create_speculative_config(args._speculative_config_dict()) == SpeculativeConfig("ngram", 3, 5, 5)
    assert not args._async_scheduling(args._speculative_config())
    with pytest.raises(ValueError, match="mutually exclusive"):
        EngineArgs(speculative_config={"num_speculative_tokens": 2}, spec_tokens=3)._speculative_config_dict()
    config = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="async_scheduling=True with speculative_config method='ngram'"):
        EngineArgs(speculative_config=config, async_scheduling=True)._speculative_config()
    with pytest.raises(ValueError, match="pipeline_parallel_size=2 is not built yet"):
        EngineArgs(speculative_config=config, pipeline_parallel_size=2)._speculative_config()


def test_the_serve_flag_takes_json_as_vllm_serve_does():
    args = _parse_args(["serve", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'])
    assert EngineArgs.from_cli_args(args).speculative_config == {"method": "ngram", "num_speculative_tokens": 2}
    args = _parse_args(["serve", "--spec-method", "ngram", "--spec-tokens", "2"])
    engine_args = EngineArgs.from_cli_args(args)
    assert (engine_args.spec_method, engine_args.spec_tokens) == ("ngram", 2)


def test_a_draft_model_must_share_the_targets_vocabulary(tmp_path):
    target = save_tiny_default_model(tmp_path / "target")
    draft = save_tiny_default_model(tmp_path / "draft", num_hidden_layers=1, vocab_size=1000)
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="has a vocabulary of 1000 tokens; the target's has 49152"):
        EngineArgs(target, speculative_config=config).create_engine_config()
    with pytest.raises(ValueError, match="method='draft_model' over nnodes=2 is not built yet"):
        EngineArgs(target, speculative_config=config, nnodes=2)


def test_an_eagle_head_must_have_the_targets_width(tmp_path):
    target = save_tiny_default_model(tmp_path / "target")
    head = save_tiny_default_model(tmp_path / "head", num_hidden_layers=1, hidden_size=32, head_dim=8)
    config = {"method": "eagle", "model": head, "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="EAGLE head has hidden_size 32; the target's is 64"):
        EngineArgs(target, speculative_config=config).create_engine_config()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"eagle_aux_hidden_state_layer_ids": [0, 1, 3]}, r"reads target layers \[0, 1, 3\].*in \[0, 2\]"),
        ({"eagle_aux_hidden_state_layer_ids": [0, 1, 1]}, "needs 3 distinct ids"),
        ({"eagle_config": {"norm_before_fc": True}}, "norm_before_fc=true is not supported"),
        ({"target_hidden_size": 128}, "EAGLE head has target_hidden_size 128; the target's is 64"),
    ],
)
def test_an_eagle3_head_must_fit_its_target(tmp_path, fields, message):
    target = save_tiny_default_model(tmp_path / "target")
    head = save_eagle3_head(tmp_path / "head", target)
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    (tmp_path / "head" / "config.json").write_text(json.dumps({**config, **fields}))
    speculative_config = {"method": "eagle3", "model": head, "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match=message):
        EngineArgs(target, speculative_config=speculative_config).create_engine_config()


def test_eagle3_reads_vllms_default_target_layers_unless_its_config_names_them():
    config = transformers.LlamaConfig()
    assert aux_hidden_state_layer_ids(config, 32) == (2, 16, 29)
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": [30, 1, 17]}
    assert aux_hidden_state_layer_ids(config, 32) == (1, 17, 30)
