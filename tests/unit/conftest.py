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
