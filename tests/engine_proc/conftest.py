"""The event loop of each engine-process test module: one per module, so the module's
AsyncLLM (a module fixture) and its tests run on the same loop."""

import asyncio

import pytest


@pytest.fixture(scope="module")
def loop():
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()
