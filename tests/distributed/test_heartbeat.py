"""The ranks' heartbeats over real ZeroMQ sockets on 127.0.0.1, with short timeouts: rank 0
notices a rank that stops pinging, a rank notices rank 0 going silent, and neither side
reports anything while both live."""

import dataclasses
import time

import pytest
import zmq

from vjx.distributed import channel
from vjx.distributed.channel import free_ports


@pytest.fixture
def short_timeouts(monkeypatch):
    monkeypatch.setattr(channel, "HEARTBEAT_INTERVAL_S", 0.1)
    monkeypatch.setattr(channel, "HEARTBEAT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(channel, "STARTUP_GRACE_S", 3.0)


def _wait_for(failures: list, timeout_s: float) -> float:
    start = time.monotonic()
    while not failures and time.monotonic() - start < timeout_s:
        time.sleep(0.02)
    return time.monotonic() - start


@dataclasses.dataclass
class _Pair:
    server: channel.HeartbeatServer
    client: channel.HeartbeatClient
    server_failures: list
    client_failures: list


@pytest.fixture
def pair(short_timeouts):
    """Rank 0's server and rank 1's client on real sockets; each side's failures collected."""
    address = f"tcp://127.0.0.1:{free_ports()}"
    context = zmq.Context()
    server_failures, client_failures = [], []
    server = channel.HeartbeatServer(context, address, [b"rank1"], on_failure=server_failures.append)
    client = channel.HeartbeatClient(context, address, b"rank1", on_failure=client_failures.append)
    yield _Pair(server, client, server_failures, client_failures)
    server.stop()
    client.stop()
    context.term()


def test_rank_zero_notices_a_rank_that_stops_pinging(pair):
    # Alive for three timeouts: nobody is declared dead.
    time.sleep(3.0)
    assert pair.server_failures == [] and pair.client_failures == []
    pair.client.stop()
    elapsed = _wait_for(pair.server_failures, 4.0)
    assert pair.server_failures == ["rank1"]
    assert elapsed < 2.5


def test_a_rank_notices_rank_zero_going_silent(pair):
    time.sleep(0.5)
    pair.server.stop()
    elapsed = _wait_for(pair.client_failures, 4.0)
    assert pair.client_failures and "the head stopped answering" in pair.client_failures[0]
    assert elapsed < 2.5


def test_a_rank_that_never_pings_is_dead_after_the_startup_grace(short_timeouts):
    context = zmq.Context()
    failures = []
    server = channel.HeartbeatServer(context, f"tcp://127.0.0.1:{free_ports()}", [b"rank1"], failures.append)
    try:
        time.sleep(1.5)
        assert failures == [], "still inside the start-up grace"
        assert _wait_for(failures, 4.0) < 3.0 and failures
    finally:
        server.stop()
        context.term()


def test_a_peer_is_watched_only_once_it_is_added(short_timeouts):
    """A remote replica is watched from its handshake on: silent before, nobody is declared
    dead; silent after `watch`, it is, within a timeout."""
    context = zmq.Context()
    failures = []
    server = channel.HeartbeatServer(context, f"tcp://127.0.0.1:{free_ports()}", on_failure=failures.append)
    try:
        time.sleep(3.5)
        assert failures == [], "an identity nobody watches is never declared dead"
        server.watch(b"replica1")
        assert _wait_for(failures, 4.0) < 2.5 and failures == ["replica1"]
    finally:
        server.stop()
        context.term()
