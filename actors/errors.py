"""Wire error codes: every error reply names one of these, plus a human sentence.

Numbers follow Kafka's protocol where Kafka has the same error, so a reader who knows Kafka knows
these; railmq-only codes start at 1000. On the wire an error is a plain integer (an unknown future
code still decodes); in code compare against `ErrorCode` members, which are ints.

`RETRIABLE` lists the codes a client may retry after refreshing metadata: the broker refused the
request before applying it, or the outcome is unknown (REQUEST_TIMED_OUT) — a retry of the latter
may duplicate a record unless the producer is idempotent.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41  # asked a controller that is not the active one: the reply names the one it knows
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    STORAGE_ERROR = 56
    UNKNOWN_PRODUCER_ID = 59
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77  # a follower fetch from a process of an ISR member other than the one on record
    FENCED_INSTANCE_ID = 82
    INVALID_RECORD = 87
    UNKNOWN_TOPIC_ID = 100
    DUPLICATE_BROKER_REGISTRATION = 101  # a second node agent for a node another agent runs
    INCONSISTENT_CLUSTER_ID = 104
    INVALID_RECORD_STATE = 121
    # railmq-only codes
    UNKNOWN_MESSAGE = 1000
    MALFORMED_FRAME = 1001
    BUSY = 1002
    DISK_FULL = 1003
    LIMIT_REACHED = 1004  # a bound of actors/limits.py; the sentence names it


RETRIABLE = frozenset({
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.UNKNOWN_TOPIC_ID,
    ErrorCode.BUSY,
    ErrorCode.NOT_CONTROLLER,
})


def error_name(code: int) -> str:
    """The symbolic name of a code, or `ERROR_<n>` for a code this version does not know."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"ERROR_{code}"


class RailmqError(Exception):
    """An error reply turned into an exception on the client side: code plus the broker's sentence."""

    def __init__(self, code: int, message: str = "") -> None:
        self.code = int(code)
        self.name = error_name(code)
        super().__init__(f"{self.name}: {message}" if message else self.name)

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE
