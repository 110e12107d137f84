"""ServerArgs: the HTTP server's own arguments; `vjx serve` flags are generated from them
(next to EngineArgs's), each field's help is its doc."""

import argparse
import dataclasses

_ACCESS_LOGS = ("off", "text", "json")


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
    chat_template: str | None = _field(
        None, "Chat template (a file or the Jinja text); the tokenizer's when not given."
    )
    shutdown_timeout: float = _field(30.0, "Seconds SIGTERM waits for in-flight requests before stopping.")
    max_request_body_bytes: int = _field(16 * 1024 * 1024, "Largest request body; larger ones get a 400.")
    max_header_bytes: int = _field(16 * 1024, "Largest total size of a request's headers; larger ones get a 400.")
    access_log: str = _field("text", f"Access log lines: one of {_ACCESS_LOGS}.")
    stats_interval: float = _field(10.0, "Seconds between stats log lines (unless --disable-log-stats).")
    log_level: str = _field("info", "Log level of the server and uvicorn: debug, info, warning or error.")

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            kind = f.type if isinstance(f.type, type) else None
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
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}.")
        if self.stats_interval <= 0:
            raise ValueError(f"stats_interval must be > 0, got {self.stats_interval}.")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it out to serve without a key).")
