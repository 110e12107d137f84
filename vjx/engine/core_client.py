"""EngineCoreClient: how the front end reaches EngineCore (in this process, for now)."""

from vjx.config import VjxConfig
from vjx.core.sched.stats import SchedulerStats
from vjx.engine.core import EngineCore
from vjx.engine.messages import EngineCoreOutputs, EngineCoreRequest


class InprocClient:
    """Calls EngineCore directly; `get_output()` runs one step."""

    def __init__(self, config: VjxConfig):
        self.engine_core = EngineCore(config)

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def make_stats(self) -> SchedulerStats:
        return self.engine_core.make_stats()

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step_fn()
