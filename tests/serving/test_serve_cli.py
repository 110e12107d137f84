"""`vjx serve` flags, its YAML --config file and `vjx bench` forwarding; no server runs."""

import argparse

import pytest

from benchmarks.serve import RequestResult, summarize
from serving.cli import _parse_args, main
from serving.config_file import load_config_file
from serving.server_args import ServerArgs
from vjx.engine_args import EngineArgs


def _serve_parser() -> argparse.ArgumentParser:
    from serving.cli import _make_parser

    return _make_parser()[1]


def test_config_file_values_become_typed_defaults(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(
        "max-model-len: 512\nenable_prefix_caching: false\nserved-model-name: smol\n"
        "shutdown-timeout: 5\nhost: 0.0.0.0\n"
    )
    assert load_config_file(str(path), _serve_parser()) == {
        "max_model_len": 512,
        "enable_prefix_caching": False,
        "served_model_name": ["smol"],
        "shutdown_timeout": 5.0,
        "host": "0.0.0.0",
    }


def test_command_line_wins_over_the_config_file(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("port: 9001\nmax-num-seqs: 8\n")
    args = _parse_args(["serve", "some/model", "--config", str(path), "--port", "9002"])
    assert (args.port, args.max_num_seqs, args.model_tag) == (9002, 8, "some/model")
    assert ServerArgs.from_cli_args(args).port == 9002


@pytest.mark.parametrize(
    "text, message",
    [
        ("no-such-flag: 1\n", "'no-such-flag' is not a flag"),
        ("enable-prefix-caching: 3\n", "must be true or false"),
        ("max-model-len: lots\n", "'max-model-len' must be of type int"),
        ("- a\n- b\n", "must hold a mapping"),
        ("port: [1, 2]\n", "'port' must be a single value"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_config_files_are_refused_by_name(tmp_path, capsys, text, message):
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    assert main(["serve", "--config", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_config_file(capsys):
    assert main(["serve", "--config", "/nonexistent/serve.yaml"]) == 2
    assert "cannot be read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--port", "70000"], "port must be in [0, 65535]"),
        (["--access-log", "xml"], "access_log must be one of"),
        (["--max-request-body-bytes", "10"], "max_request_body_bytes must be at least 1024"),
        (["--api-key", ""], "api_key must not be empty"),
        (["--max-n", "0"], "max_n must be at least 1, got 0"),
        (["--max-tokens-limit", "0"], "max_tokens_limit must be at least 1, got 0"),
        (["--max-num-queued-reqs", "-1"], "max_num_queued_reqs must be >= 0, got -1"),
    ],
)
def test_bad_server_flags(flags, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ServerArgs.from_cli_args(_parse_args(["serve", *flags]))


def test_limit_flags_are_typed_and_the_queue_defaults_past_the_running_requests():
    defaults = ServerArgs.from_cli_args(_parse_args(["serve"]))
    assert (defaults.max_prompts_per_request, defaults.max_n, defaults.max_tokens_limit) == (256, 128, None)
    assert (defaults.max_stop_strings, defaults.max_stop_string_length) == (32, 1024)
    assert defaults.queued_reqs_limit(max_num_running=2 * 256) == 512 + 1024
    args = ServerArgs.from_cli_args(_parse_args(["serve", "--max-tokens-limit", "64", "--max-num-queued-reqs", "0"]))
    assert (args.max_tokens_limit, args.queued_reqs_limit(max_num_running=16)) == (64, 0)


def test_hub_and_generation_config_flags_become_engine_args(tmp_path, capsys):
    flags = ["--revision", "v2", "--tokenizer-revision", "main", "--download-dir", str(tmp_path)]
    flags += ["--generation-config", "vllm", "--override-generation-config", '{"temperature": 0.5}']
    args = EngineArgs.from_cli_args(_parse_args(["generate", "--prompt", "x", "--model", "org/name", *flags]))
    assert (args.model, args.revision, args.tokenizer_revision, args.download_dir) == (
        "org/name",
        "v2",
        "main",
        str(tmp_path),
    )
    assert (args.generation_config, args.override_generation_config) == ("vllm", {"temperature": 0.5})
    assert EngineArgs.from_cli_args(_parse_args(["serve"])).override_generation_config == {}
    with pytest.raises(SystemExit):
        _parse_args(["serve", "--override-generation-config", "[1]"])
    assert "--override-generation-config: must be a JSON object, got '[1]'" in capsys.readouterr().err


def test_model_given_twice_differently(capsys):
    assert main(["serve", "a/model", "--model", "b/model"]) == 2
    assert "model is given twice" in capsys.readouterr().err


def test_bench_forwards_to_the_benchmarks_cli(capsys):
    assert main(["bench", "no-such-benchmark"]) == 2
    assert "benchmark must be one of" in capsys.readouterr().err


def test_serve_benchmark_summary():
    results = [
        RequestResult(ok=True, latency_s=1.0, ttft_s=0.2, itls_s=[0.4, 0.4], num_output_tokens=3),
        RequestResult(ok=True, latency_s=2.0, ttft_s=0.4, itls_s=[0.8, 0.8], num_output_tokens=3),
        RequestResult(ok=False, error="APIConnectionError: boom"),
    ]
    summary = summarize(results, duration_s=4.0, rate=float("inf"), input_len=10)
    assert (summary["request_rate"], summary["completed"], summary["failed"]) == ("inf", 2, 1)
    assert summary["request_throughput"] == 0.5 and summary["output_throughput"] == 1.5
    assert summary["total_token_throughput"] == 6.5
    assert summary["ttft_ms"]["mean"] == pytest.approx(300.0)
    assert summary["tpot_ms"]["mean"] == pytest.approx(600.0) and summary["tpot_ms"]["median"] == pytest.approx(600.0)
    assert summary["itl_ms"]["median"] == pytest.approx(600.0)
    assert summary["errors"] == ["APIConnectionError: boom"]
