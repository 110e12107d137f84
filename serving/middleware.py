"""ServerGuard: the ASGI middleware every HTTP request passes before reaching a route.

In order: the headers' total size, the API key (every path but /health), then the body,
read whole up to `max_body_bytes` and replayed to the app, so a route never sees an
oversized body. Each refusal is the OpenAI error JSON. It also writes the access log.
"""

import hmac
import json
import logging
import time

from serving.errors import error_body

access_logger = logging.getLogger("vjx.access")

_UNGUARDED_PATHS = frozenset({"/health"})
# An oversized body is read and dropped up to this many times the limit, so the client
# finishes sending and reads the 400; past that the connection is closed.
_DRAIN_FACTOR = 8


class ServerGuard:
    def __init__(self, app, api_key: str | None, max_header_bytes: int, max_body_bytes: int, access_log: str = "off"):
        self.app = app
        self.expected_auth = None if api_key is None else f"Bearer {api_key}".encode()
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.access_log = access_log

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [0]

        async def send_and_watch(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self._check_headers(scope)
            body = b""
            if refusal is None:
                body, refusal = await self._read_body(scope, receive)
            if refusal is not None:
                await _send_error(send_and_watch, *refusal)
                return
            await self.app(scope, _replay(body, receive), send_and_watch)
        finally:
            if self.access_log != "off":
                self._log_access(scope, status[0], time.perf_counter() - start)

    def _check_headers(self, scope) -> tuple[int, str] | None:
        size = sum(len(name) + len(value) for name, value in scope["headers"])
        if size > self.max_header_bytes:
            return 400, (
                f"The request headers ({size} bytes) exceed the server's limit of {self.max_header_bytes} bytes."
            )
        if self.expected_auth is not None and scope["path"] not in _UNGUARDED_PATHS:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(auth, self.expected_auth):
                return 401, "Invalid or missing API key: send 'Authorization: Bearer <key>'."
        return None

    async def _read_body(self, scope, receive) -> tuple[bytes, tuple[int, str] | None]:
        limit = self.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit * _DRAIN_FACTOR:
            return b"", (400, f"The request body ({int(declared)} bytes) exceeds the server's limit of {limit} bytes.")
        chunks, size, more_body = [], 0, True
        while more_body:
            message = await receive()
            if message["type"] != "http.request":
                return b"", (400, "The client disconnected before sending the whole body.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > limit * _DRAIN_FACTOR:
                break
            more_body = message.get("more_body", False)
        if size > limit:
            return b"", (400, f"The request body ({size} bytes or more) exceeds the server's limit of {limit} bytes.")
        return b"".join(chunks), None

    def _log_access(self, scope, status: int, duration_s: float) -> None:
        client = scope.get("client")
        client = f"{client[0]}:{client[1]}" if client else "-"
        if self.access_log == "json":
            access_logger.info(
                json.dumps(
                    {
                        "time": round(time.time(), 3),
                        "client": client,
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round(duration_s * 1000, 2),
                    }
                )
            )
        else:
            access_logger.info(
                '%s "%s %s" %d %.1f ms', client, scope["method"], scope["path"], status, duration_s * 1000
            )


def _replay(body: bytes, receive):
    """A `receive` that gives the buffered body once, then the client's later messages
    (the disconnect a streaming response listens for)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _send_error(send, status: int, message: str) -> None:
    body = error_body(message, status)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
