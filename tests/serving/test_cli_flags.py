"""`vjx serve` takes vLLM's engine flags as vLLM spells them: short flags and aliases, `-O3`,
underscores, `--json-flag.key`, human-readable numbers, and a YAML --config file read the way
vLLM reads it. Parsing only: no engine starts."""

import pytest

from serving.cli import _make_parser, _parse_args, main
from vjx.engine.vllm_args import FLAG_ALIASES, VLLM_ARGS
from vjx.engine_args import EngineArgs


def _serve_options() -> set[str]:
    return set(_make_parser()[1]._option_string_actions)


def test_every_vllm_flag_is_a_serve_flag():
    options = _serve_options()
    for arg in VLLM_ARGS:
        if arg.flag is not None:
            assert "--" + arg.name.replace("_", "-") in options, arg.name
    assert {alias for aliases in FLAG_ALIASES.values() for alias in aliases} <= options


@pytest.mark.parametrize(
    "flags, name, value",
    [
        (["-tp", "2"], "tensor_parallel_size", 2),
        (["-dp", "4"], "data_parallel_size", 4),
        (["-pp", "2"], "pipeline_parallel_size", 2),
        (["-dcp", "2"], "decode_context_parallel_size", 2),
        (["-q", "awq"], "quantization", "awq"),
        (["-ep"], "enable_expert_parallel", True),
        (["--device-memory-utilization", "0.5"], "gpu_memory_utilization", 0.5),
        (["-O3"], "optimization_level", 3),
        (["-O", "1"], "optimization_level", 1),
        (["-O=0"], "optimization_level", 0),
        (["--max_model_len", "2k"], "max_model_len", 2000),
        (["--max-model-len=1K"], "max_model_len", 1024),
        (["--max-model-len", "auto"], "max_model_len", -1),
        (["--max-num-batched-tokens", "8k"], "max_num_batched_tokens", 8000),
        (["--enforce-eager"], "enforce_eager", True),
        (["--no-enable-prefix-caching"], "enable_prefix_caching", False),
        (["--trust_remote_code"], "trust_remote_code", True),
        (["--hf-token"], "hf_token", True),
        (["--hf-token", "hf_abc"], "hf_token", "hf_abc"),
        (["--speculative-config", '{"method": "ngram"}'], "speculative_config", {"method": "ngram"}),
        (["-cc", '{"mode": 3}'], "compilation_config", {"mode": 3}),
        (["--cudagraph-capture-sizes", "1", "2"], "cudagraph_capture_sizes", [1, 2]),
        (["--hf-overrides", "gpt2"], "hf_overrides", "gpt2"),
        (["--kv-cache-memory-bytes", "None"], "kv_cache_memory_bytes", None),
    ],
)
def test_vllm_spellings(flags, name, value):
    assert getattr(_parse_args(["serve", "org/model", *flags]), name) == value


def test_json_flags_take_their_keys_one_by_one():
    flags = ["--compilation-config.mode", "3", "-cc.backend=eager", "-cc.sizes+", "1,2", "-cc.pass_config.fuse", "true"]
    args = _parse_args(["serve", "org/model", *flags, "--port", "9001"])
    assert args.compilation_config == {
        "mode": 3,
        "backend": "eager",
        "sizes": ["1", "2"],
        "pass_config": {"fuse": True},
    }
    assert args.port == 9001


def test_the_model_is_positional_or_a_flag():
    assert _parse_args(["serve", "org/model", "-tp", "2"]).model_tag == "org/model"
    assert _parse_args(["serve", "-tp", "2", "--model", "org/model"]).model == "org/model"


def test_engine_args_from_the_command_line_log_or_refuse(capsys):
    args = EngineArgs.from_cli_args(_parse_args(["serve", "org/model", "-tp", "2", "-O3", "--enforce-eager"]))
    assert (args.tensor_parallel_size, args.optimization_level, args.enforce_eager) == (2, 3, True)
    assert main(["serve", "org/model", "--decode-context-parallel-size", "2"]) == 2
    assert "decode_context_parallel_size=2 is not supported by vjx" in capsys.readouterr().err


def test_server_flags_stay_the_servers():
    args = _parse_args(["serve", "--shutdown-timeout", "5", "--served-model-name", "a", "b"])
    assert (args.shutdown_timeout, args.served_model_name) == (5.0, ["a", "b"])
    assert EngineArgs.from_cli_args(args).shutdown_timeout == 0


def _config(tmp_path, text: str, name: str = "serve.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_config_file_reads_vllms_keys(tmp_path):
    path = _config(
        tmp_path,
        "model: org/model\ntensor_parallel_size: 2\nenforce-eager: true\nenable-prefix-caching: false\n"
        "device-memory-utilization: 0.5\nmax-model-len: 32k\ncompilation-config:\n  mode: 3\n"
        "cudagraph-capture-sizes: [1, 2]\nhf-token: true\ndisable-log-stats: false\n",
    )
    args = _parse_args(["serve", "--config", path])
    assert (args.model, args.tensor_parallel_size, args.enforce_eager) == ("org/model", 2, True)
    assert (args.enable_prefix_caching, args.gpu_memory_utilization, args.max_model_len) == (False, 0.5, 32000)
    assert (args.compilation_config, args.cudagraph_capture_sizes) == ({"mode": 3}, [1, 2])
    assert (args.hf_token, args.disable_log_stats) == (True, False)


def test_command_line_flags_win_over_the_config_file(tmp_path):
    path = _config(tmp_path, "tensor-parallel-size: 2\nenforce-eager: true\nmax-num-seqs: 8\n")
    args = _parse_args(["serve", "org/model", "--config", path, "-tp", "4", "--no-enforce-eager"])
    assert (args.model_tag, args.tensor_parallel_size, args.enforce_eager, args.max_num_seqs) == (
        "org/model",
        4,
        False,
        8,
    )


@pytest.mark.parametrize(
    "text, name, message",
    [
        ("tp: 2\n", "serve.yaml", "config key 'tp' is not a flag"),
        ("max-model-len: 2.5\n", "serve.yaml", "'max-model-len' must be of type int, got '2.5'"),
        ("compilation-config: fast\n", "serve.yaml", "'compilation-config' must be of type dict"),
        ("port: 9000\n", "serve.json", "must be a .yaml or .yml file"),
    ],
)
def test_bad_config_keys_and_files(tmp_path, capsys, text, name, message):
    assert main(["serve", "--config", _config(tmp_path, text, name)]) == 2
    assert message in capsys.readouterr().err
