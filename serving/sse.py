"""EventStreamResponse: server-sent events that abort their request when the client leaves.

Starlette's StreamingResponse notices a gone client only when a send fails (and then
leaves the body generator suspended). This response also listens for `http.disconnect`
and, either way, closes the body generator, whose `finally` aborts the engine requests
and so frees their KV blocks at once.
"""

import asyncio
from collections.abc import AsyncGenerator, Callable

from starlette.responses import Response

from serving.errors import OpenAIError
from vjx.engine.async_llm import RequestOutputStream
from vjx.engine.exceptions import EngineDeadError

DONE_EVENT = "data: [DONE]\n\n"


def sse_event(data: str) -> str:
    return f"data: {data}\n\n"


def to_openai_error(error: Exception, request_id: str | None = None) -> OpenAIError:
    """The error a failed request reports: its own, 503 for a dead engine, else a 500 that
    names no internals (the server log has them, under `request_id`)."""
    if isinstance(error, OpenAIError):
        return error
    if isinstance(error, EngineDeadError):
        return OpenAIError.engine_dead(error)
    return OpenAIError.internal(error, request_id)


def error_event(error: Exception, request_id: str | None = None) -> str:
    return sse_event(to_openai_error(error, request_id).to_json_bytes().decode())


class EventStreamResponse(Response):
    """An ASGI response streaming `body`'s strings as `text/event-stream`."""

    media_type = "text/event-stream"
    background = None

    def __init__(self, body: AsyncGenerator[str, None], streams: list[RequestOutputStream]):
        """`streams` are the engine requests behind `body`: closed (aborted unless finished)
        when the response ends, even when `body` never started."""
        self.body_iterator = body
        self.streams = streams
        self.on_close: list[Callable[[], None]] = []
        """Called once the response has ended, however it ended."""

    async def __call__(self, scope, receive, send) -> None:
        stream = asyncio.ensure_future(self._stream(send))
        disconnect = asyncio.ensure_future(self._wait_for_disconnect(receive))
        try:
            await asyncio.wait([stream, disconnect], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, disconnect):
                task.cancel()
            await asyncio.gather(stream, disconnect, return_exceptions=True)
            await self.body_iterator.aclose()
            for request_stream in self.streams:
                await request_stream.aclose()
            for callback in self.on_close:
                callback()

    async def _stream(self, send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            async for event in self.body_iterator:
                await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            # The client went away mid-send; the caller closes the body.
            return

    @staticmethod
    async def _wait_for_disconnect(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
