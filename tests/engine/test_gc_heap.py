"""The start-up heap freeze: frozen garbage waits, it is frozen while any engine lives, and
one engine's shutdown never unfreezes another live engine's heap."""

import gc
import weakref

import pytest

from vjx.process_setup import HeapFreeze


class _Node:
    """A reference cycle: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


class _Engine:
    """A light stand-in for an engine object."""


@pytest.fixture
def heap_freeze():
    """A registry of its own, with nothing frozen before or after the test."""
    gc.unfreeze()
    yield HeapFreeze()
    gc.unfreeze()


def test_frozen_cycles_wait_for_unfreeze(heap_freeze):
    node = _Node()
    ref = weakref.ref(node)
    engine = _Engine()
    heap_freeze.engine_started(engine)
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert ref() is not None, "a frozen cycle is invisible to collections"
    heap_freeze.engine_stopped(engine)
    assert gc.get_freeze_count() == 0
    assert ref() is None, "the last engine's shutdown collects what was frozen"


def test_stopping_an_engine_never_started_does_nothing(heap_freeze):
    heap_freeze.engine_stopped(_Engine())
    assert gc.get_freeze_count() == 0
    assert heap_freeze.num_live_engines == 0


def test_one_engine_shutdown_leaves_another_live_engine_frozen(heap_freeze):
    first, second = _Engine(), _Engine()
    first.node = _Node()
    garbage = weakref.ref(first.node)
    heap_freeze.engine_started(first)
    heap_freeze.engine_started(second)
    del first.node
    heap_freeze.engine_stopped(first)
    assert gc.get_freeze_count() > 0, "the second engine still lives: its heap stays frozen"
    assert garbage() is None, "the shutdown collected frozen garbage before freezing again"
    assert all(obj is not second for obj in gc.get_objects()), "the live engine is frozen, not tracked"
    heap_freeze.engine_stopped(first)
    assert heap_freeze.num_live_engines == 1, "a second shutdown does not count twice"
    assert gc.get_freeze_count() > 0
    heap_freeze.engine_stopped(second)
    assert heap_freeze.num_live_engines == 0
    assert gc.get_freeze_count() == 0


def test_engine_start_collects_engines_dropped_without_shutdown(heap_freeze):
    """A dropped engine (a cycle, as real engines are) frozen with an earlier start is freed
    when the next engine starts, before it measures free memory."""
    dropped = _Engine()
    dropped.me = dropped
    ref = weakref.ref(dropped)
    heap_freeze.engine_started(dropped)
    del dropped
    gc.collect()
    assert ref() is not None, "frozen, the dropped engine waits"
    heap_freeze.collect()
    assert ref() is None, "the next start's collection frees it"
    assert heap_freeze.num_live_engines == 0, "a collected engine no longer counts"
    assert gc.get_freeze_count() == 0
    live = _Engine()
    heap_freeze.engine_started(live)
    assert gc.get_freeze_count() > 0
    heap_freeze.engine_stopped(live)
