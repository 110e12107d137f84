"""OpenAIError: every failure the server reports, as the OpenAI API's error JSON.

`{"error": {"message": ..., "type": ..., "param": ..., "code": <HTTP status>}}`: the
`type` is the OpenAI API's word for the status, `param` names the request field at fault
when one is known. Failures inside the server (a dead engine, a bug) reach the client as a
short fixed message; their detail, which can hold a traceback and file paths, goes to the
server log.
"""

import functools
import http
import json
import logging

import pydantic

from vjx.engine.exceptions import EngineDeadError

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}
ENGINE_DEAD_MESSAGE = "The engine is not running; see the server log."


class OpenAIError(Exception):
    """A request failed with `status_code`; the message is for the person who sent it, the
    `headers` go with the response (e.g. Retry-After)."""

    def __init__(
        self, message: str, status_code: int = 400, param: str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.headers = headers or {}

    def to_dict(self) -> dict:
        error_type = _TYPES.get(self.status_code, http.HTTPStatus(self.status_code).phrase.replace(" ", "_").lower())
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.status_code}}

    def to_json_bytes(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    @classmethod
    def from_value_error(cls, error: ValueError, fields: set[str] | frozenset[str] = frozenset()) -> "OpenAIError":
        """A 400 from a `ValueError` of the engine; its message starts with the argument's
        name, which becomes `param` when it is one of the request's `fields`."""
        message = str(error)
        first_word = message.split(" ", 1)[0].strip(".,:")
        return cls(message, 400, first_word if first_word in fields else None)

    @classmethod
    def from_validation_error(cls, error: pydantic.ValidationError) -> "OpenAIError":
        """A 400 naming the first bad field, e.g. `max_tokens: Input should be a valid integer`."""
        first = error.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            return cls(f"The request body is not valid JSON: {first['msg']}.", 400)
        location = ".".join(str(part) for part in first["loc"])
        param = str(first["loc"][0]) if first["loc"] else None
        message = f"{location}: {first['msg']}" if location else first["msg"]
        num_more = error.error_count() - 1
        if num_more:
            message += f" (and {num_more} more error{'s' if num_more > 1 else ''})"
        return cls(message, 400, param)

    @classmethod
    def engine_dead(cls, error: EngineDeadError) -> "OpenAIError":
        """The 503 of a dead engine; why it died is logged (once), not sent."""
        _log_engine_death(str(error))
        return cls(ENGINE_DEAD_MESSAGE, 503)

    @classmethod
    def internal(cls, error: BaseException, request_id: str | None) -> "OpenAIError":
        """The 500 of an unexpected failure: logged with its traceback and the request id,
        which the client's message names so the two can be matched up."""
        logger.error("Request %s failed in the server.", request_id or "(no id yet)", exc_info=error)
        where = f" (request {request_id})" if request_id else ""
        return cls(f"The server failed on this request{where}; see the server log.", 500)


@functools.cache
def _log_engine_death(reason: str) -> None:
    # Every later request meets the same dead engine: its reason is worth one log entry.
    logger.error("The engine is dead: %s", reason)


def error_body(message: str, status_code: int, param: str | None = None) -> bytes:
    return OpenAIError(message, status_code, param).to_json_bytes()
