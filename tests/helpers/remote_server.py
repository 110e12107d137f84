"""RemoteServer: `vjx serve` in a subprocess on a free 127.0.0.1 port, for tests to drive
with the real `openai` client and raw HTTP."""

import http.client
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import openai

from tests.helpers.large_engine import LARGE_FLAGS

ROOT = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jax_cache_env() -> dict[str, str]:
    """The test session's persistent compile cache (tests/conftest.py), for the server too
    (none when this process has none: the server then takes vjx's default)."""
    import jax

    if not jax.config.jax_compilation_cache_dir:
        return {}
    return {
        "JAX_COMPILATION_CACHE_DIR": str(jax.config.jax_compilation_cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }


class RemoteServer:
    """Started with the large engine's flags (the same shapes as the in-process engine tests,
    so the server's compiles hit the cache), then `args`."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, api_key: str | None = None):
        self.port = free_port()
        self.api_key = api_key
        self.log = tempfile.NamedTemporaryFile(prefix="vjx-serve-", suffix=".log", delete=False)
        command = [sys.executable, "-m", "serving.cli", "serve", "--port", str(self.port), *LARGE_FLAGS, *args]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **_jax_cache_env(), **(env or {})},
        )
        self._wait_until_healthy()

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vjx serve exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"vjx serve did not become healthy in {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, num_chars: int = 4000) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")[-num_chars:]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key or "unused", max_retries=0, **kwargs)

    def async_client(self, **kwargs) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url + "/v1", api_key=self.api_key or "unused", max_retries=0, **kwargs
        )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict | list | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> tuple[int, bytes]:
        """One raw HTTP request (with the API key unless `headers` has an authorization);
        returns (status, body)."""
        all_headers = {"Content-Type": "application/json"}
        if self.api_key is not None:
            all_headers["Authorization"] = f"Bearer {self.api_key}"
        all_headers.update(headers or {})
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            connection.request(method, path, body=body, headers=all_headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def metrics(self) -> dict[str, float]:
        """/metrics as {sample name: value}, labels dropped (one model, so one series each)."""
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.request("GET", "/metrics")
        assert status == 200, body
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if not sample.labels.get("le")
        }

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        self.log.close()
        return self.process.returncode
