"""The engine's start-up heap freeze: frozen garbage waits, unfreezing frees it."""

import gc
import weakref

from vjx.engine.core import freeze_gc_heap, unfreeze_gc_heap


class _Node:
    """A reference cycle: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


def test_frozen_cycles_wait_for_unfreeze():
    node = _Node()
    ref = weakref.ref(node)
    try:
        freeze_gc_heap()
        assert gc.get_freeze_count() > 0
        del node
        gc.collect()
        assert ref() is not None, "a frozen cycle is invisible to collections"
        unfreeze_gc_heap()
        assert gc.get_freeze_count() == 0
        assert ref() is None, "unfreeze_gc_heap collects what was frozen"
    finally:
        gc.unfreeze()


def test_unfreeze_without_a_freeze_does_nothing():
    gc.unfreeze()
    unfreeze_gc_heap()
    assert gc.get_freeze_count() == 0
