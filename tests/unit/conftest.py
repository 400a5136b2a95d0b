"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
import zmq


@pytest.fixture
def zmq_context():
    """A ZeroMQ context of the test's own, destroyed with everything on it when the test ends."""
    context = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


@pytest.fixture
def actor_locks():
    """build_actor keeps each directory lock for the life of the process; a test gives them back."""
    from transport import actor_main

    held = len(actor_main._LOCKS)
    yield
    while len(actor_main._LOCKS) > held:
        actor_main._LOCKS.pop().release()
