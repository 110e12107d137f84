"""The waiting queue of the scheduler: first come first served, or by priority."""

import abc
import collections
import enum
import heapq
import itertools
from collections.abc import Iterable, Iterator

from vjx.core.request import Request


class SchedulingPolicy(enum.Enum):
    """Which waiting request is admitted next, and which running one is preempted first."""

    FCFS = "fcfs"
    """Arrival order; preempt the most recently admitted."""
    PRIORITY = "priority"
    """Lowest (priority, arrival_time) first; preempt the highest."""


class RequestQueue(abc.ABC):
    """Waiting requests in the order the scheduler should admit them."""

    @abc.abstractmethod
    def add_request(self, request: Request) -> None: ...

    @abc.abstractmethod
    def pop_request(self) -> Request: ...

    @abc.abstractmethod
    def peek_request(self) -> Request: ...

    @abc.abstractmethod
    def prepend_request(self, request: Request) -> None:
        """Put back a request that should go before the others (a preempted one)."""

    @abc.abstractmethod
    def remove_requests(self, requests: Iterable[Request]) -> None: ...

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The requests in admission order."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(RequestQueue):
    """Arrival order; a preempted request goes back to the front."""

    def __init__(self) -> None:
        self._requests: collections.deque[Request] = collections.deque()

    def add_request(self, request: Request) -> None:
        self._requests.append(request)

    def pop_request(self) -> Request:
        return self._requests.popleft()

    def peek_request(self) -> Request:
        if not self._requests:
            raise IndexError("peek_request: the queue is empty.")
        return self._requests[0]

    def prepend_request(self, request: Request) -> None:
        self._requests.appendleft(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = {id(request) for request in requests}
        self._requests = collections.deque(r for r in self._requests if id(r) not in to_remove)

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)


class PriorityRequestQueue(RequestQueue):
    """A heap on (priority, arrival_time): a lower priority value is served first.

    Ties keep insertion order. A preempted request needs no special place: its priority
    and arrival time put it back where it belongs.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add_request(self, request: Request) -> None:
        entry = (request.priority, request.arrival_time, next(self._counter), request)
        heapq.heappush(self._heap, entry)

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek_request: the queue is empty.")
        return self._heap[0][-1]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = {id(request) for request in requests}
        self._heap = [entry for entry in self._heap if id(entry[-1]) not in to_remove]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap))


def create_request_queue(policy: SchedulingPolicy | str) -> RequestQueue:
    """The queue for `policy`, the `scheduling_policy` setting ("fcfs" or "priority")."""
    try:
        policy = SchedulingPolicy(policy)
    except ValueError:
        allowed = [p.value for p in SchedulingPolicy]
        raise ValueError(f"scheduling_policy must be one of {allowed}, got {policy!r}.") from None
    if policy is SchedulingPolicy.PRIORITY:
        return PriorityRequestQueue()
    return FCFSRequestQueue()
