"""Errors the front end raises about the engine process."""


class EngineDeadError(RuntimeError):
    """The engine process exited or crashed; no call will succeed any more."""


class EngineRequestError(RuntimeError):
    """One request failed inside the engine; the engine keeps serving the others."""

    def __init__(self, request_id: str, message: str):
        super().__init__(f"request {request_id!r} failed in the engine: {message}")
        self.request_id = request_id
