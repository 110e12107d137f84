"""A request's structured-output state in the engine core: its grammar, once compiled."""

import concurrent.futures
import dataclasses

from vjx.sampling_params import StructuredOutputsParams
from vjx.structured_output.backend_guidance import GuidanceGrammar


@dataclasses.dataclass
class StructuredOutputRequest:
    params: StructuredOutputsParams
    future: concurrent.futures.Future
    """The grammar compiling in the manager's thread pool."""
    reasoning_ended: bool = False
    """The request's reasoning is over (or there is none): its tokens follow the grammar."""

    @property
    def is_ready(self) -> bool:
        return self.future.done()

    @property
    def error(self) -> str | None:
        """Why the grammar could not compile, once it is done; None when it compiled."""
        exception = self.future.exception() if self.future.done() else None
        return None if exception is None else str(exception)

    @property
    def grammar(self) -> GuidanceGrammar | None:
        """The compiled grammar; None while it compiles or when it failed."""
        if not self.future.done() or self.future.exception() is not None:
            return None
        return self.future.result()
