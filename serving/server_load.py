"""ServerLoad: vLLM's `GET /load` metric, the generation requests in flight.

Counted only with --enable-server-load-tracking (vLLM's flag; 0 otherwise): a request
counts from when its body is parsed until its response ends, the last event of a stream
included, so a load balancer can route by it.
"""


class ServerLoad:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.num_requests = 0

    def enter(self) -> None:
        if self.enabled:
            self.num_requests += 1

    def exit(self) -> None:
        if self.enabled:
            self.num_requests -= 1

    def to_dict(self) -> dict:
        return {"server_load": self.num_requests}
