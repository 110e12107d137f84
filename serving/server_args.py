"""ServerArgs: the HTTP server's own arguments; `vjx serve` flags are generated from them
(next to EngineArgs's), each field's help is its doc."""

import argparse
import dataclasses
import os
import typing

from serving.serving_models import LoRAModulePath
from serving.tool_parsers import ToolParserManager

_ACCESS_LOGS = ("off", "text", "json")
DEFAULT_QUEUE_DEPTH = 1024
"""Requests that may wait beyond what the engine runs at once, unless --max-num-queued-reqs
says otherwise."""


def _field(default, help: str, **cli):
    return dataclasses.field(default=default, metadata={"help": help, "cli": cli})


@dataclasses.dataclass(frozen=True)
class ServerArgs:
    host: str = _field("127.0.0.1", "Address to listen on (0.0.0.0 for every interface).")
    port: int = _field(8000, "Port to listen on (0 picks a free one).")
    api_key: str | None = _field(
        None,
        "Key every request but /health must send as 'Authorization: Bearer KEY'; "
        "the VJX_API_KEY environment variable when not given.",
    )
    served_model_name: list[str] | None = _field(
        None, "Names the model answers to (the first is reported); the model argument when not given.", nargs="+"
    )
    lora_modules: list[str] | None = _field(
        None,
        "LoRA adapters served as model names (vLLM's flag; needs --enable-lora): name=path entries, "
        'or JSON {"name": ..., "path": ..., "base_model_name": ...}.',
        nargs="+",
    )
    allowed_lora_dir: str | None = _field(
        None,
        "Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's runtime adapter routes), "
        "loading adapters only from under this directory; behind --api-key like every route.",
    )
    chat_template: str | None = _field(
        None, "Chat template (a file or the Jinja text); the tokenizer's when not given."
    )
    trust_request_chat_template: bool = _field(
        False, "Render a request's own chat_template (vLLM's flag); refused with a 400 otherwise.", action="store_true"
    )
    enable_auto_tool_choice: bool = _field(
        False,
        "Parse the model's tool calls into `tool_calls` (vLLM's flag; needs --tool-call-parser): "
        'tool_choice "auto", "required" and named functions are refused without it.',
        action="store_true",
    )
    tool_call_parser: str | None = _field(
        None,
        "How the model writes tool calls (vLLM's flag): one of hermes, llama3_json, llama4_json, mistral, pythonic.",
    )
    enable_prompt_tokens_details: bool = _field(
        False, "Report usage.prompt_tokens_details.cached_tokens (vLLM's flag).", action="store_true"
    )
    enable_tokenizer_info_endpoint: bool = _field(
        False, "Serve GET /tokenizer_info, the tokenizer's config and chat template (vLLM's flag).", action="store_true"
    )
    enable_server_load_tracking: bool = _field(
        False, "Count the requests in flight for GET /load (vLLM's flag; 0 otherwise).", action="store_true"
    )
    shutdown_timeout: float = _field(30.0, "Seconds SIGTERM waits for in-flight requests before stopping.")
    max_request_body_bytes: int = _field(16 * 1024 * 1024, "Largest request body; larger ones get a 400.")
    max_header_bytes: int = _field(16 * 1024, "Largest total size of a request's headers; larger ones get a 400.")
    max_prompts_per_request: int = _field(256, "Most prompts in one /v1/completions request; more get a 400.")
    max_n: int = _field(128, "Largest `n` (completions per prompt) a request may ask for; larger get a 400.")
    max_tokens_limit: int | None = _field(
        None,
        "Largest max_tokens / max_completion_tokens a request may ask for (larger get a 400), and the "
        "default when a request gives none; only max_model_len minus the prompt bounds them when not given.",
    )
    max_stop_strings: int = _field(32, "Most stop strings in one request; more get a 400.")
    max_stop_string_length: int = _field(1024, "Longest stop string, in characters; longer ones get a 400.")
    max_num_queued_reqs: int | None = _field(
        None,
        "Most engine requests in flight, running or waiting (a request with n=4 counts 4; vLLM's flag); "
        "past it a new request gets a 503 with Retry-After instead of an unbounded queue. "
        f"When not given: what the engine runs at once (max_num_seqs per replica) plus {DEFAULT_QUEUE_DEPTH}.",
    )
    access_log: str = _field("text", f"Access log lines: one of {_ACCESS_LOGS}.")
    stats_interval: float = _field(10.0, "Seconds between stats log lines (unless --disable-log-stats).")
    log_level: str = _field("info", "Log level of the server and uvicorn: debug, info, warning or error.")
    metrics_prefix: str = _field(
        "vjx", "Prefix of every /metrics name: 'vjx' (vjx:...) or 'vllm' (vLLM's names).", choices=("vjx", "vllm")
    )

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            kind = ([a for a in typing.get_args(f.type) if a is not type(None)] or [f.type])[0]
            kwargs = {"default": f.default, "help": f.metadata["help"], **f.metadata["cli"]}
            if kind in (int, float):
                kwargs["type"] = kind
            parser.add_argument("--" + f.name.replace("_", "-"), **kwargs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        server_args = cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
        server_args.verify()
        return server_args

    def verify(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}.")
        if self.access_log not in _ACCESS_LOGS:
            raise ValueError(f"access_log must be one of {_ACCESS_LOGS}, got {self.access_log!r}.")
        for name in ("max_request_body_bytes", "max_header_bytes"):
            if getattr(self, name) < 1024:
                raise ValueError(f"{name} must be at least 1024, got {getattr(self, name)}.")
        for name in ("max_prompts_per_request", "max_n", "max_tokens_limit", "max_stop_string_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}.")
        for name in ("max_stop_strings", "max_num_queued_reqs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}.")
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}.")
        if self.stats_interval <= 0:
            raise ValueError(f"stats_interval must be > 0, got {self.stats_interval}.")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("enable_auto_tool_choice requires tool_call_parser (--tool-call-parser NAME).")
        if self.tool_call_parser is not None and self.tool_call_parser not in ToolParserManager.list_registered():
            raise ValueError(
                f"tool_call_parser must be one of {ToolParserManager.list_registered()}, got {self.tool_call_parser!r}."
            )
        for entry in self.lora_modules or []:
            LoRAModulePath.parse(entry)
        if self.allowed_lora_dir is not None and not os.path.isdir(self.allowed_lora_dir):
            raise ValueError(f"allowed_lora_dir must be a directory, got {self.allowed_lora_dir!r}.")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it out to serve without a key).")

    def queued_reqs_limit(self, max_num_running: int) -> int:
        """--max-num-queued-reqs, or, when not given, `max_num_running` (what the engine runs
        at once: max_num_seqs times the data-parallel replicas) plus the default queue depth."""
        if self.max_num_queued_reqs is not None:
            return self.max_num_queued_reqs
        return max_num_running + DEFAULT_QUEUE_DEPTH
