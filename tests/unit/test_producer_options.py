"""A producer's options are checked when it is made, before any thread or socket exists: a value
that cannot work is a ValueError naming the option, not a producer that hangs or misbehaves.

Before these checks, `request_timeout_ms=0` made every request time out at once and the send
retried until its delivery timeout; `acks="most"` said "invalid literal for int()"; a negative
`linger_ms` or `max_block_ms` was taken as it came.
"""

from __future__ import annotations

import pytest

from railmq.producer import Producer

NOWHERE = "tcp://127.0.0.1:1"


@pytest.mark.parametrize("options, named", [
    ({"acks": 5}, "acks"),
    ({"acks": "most"}, "acks"),
    ({"acks": None}, "acks"),
    ({"request_timeout_ms": 0}, "request_timeout_ms"),
    ({"delivery_timeout_ms": -5}, "delivery_timeout_ms"),
    ({"batch_bytes_max": 0}, "batch_bytes_max"),
    ({"buffer_bytes_max": 0}, "buffer_bytes_max"),
    ({"max_in_flight": 0}, "max_in_flight"),
    ({"linger_ms": -1}, "linger_ms"),
    ({"max_block_ms": -1}, "max_block_ms"),
    ({"retry_backoff_ms": -100}, "retry_backoff_ms"),
    ({"idempotent": True, "max_in_flight": 6}, "idempotent"),
])
def test_an_option_that_cannot_work_is_refused_naming_it(options, named):
    with pytest.raises(ValueError, match=named):
        Producer(NOWHERE, **options)
