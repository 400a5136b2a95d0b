"""A share member whose acquired records the leader's log start passes (retention, while the
records were in flight) drops only what the log no longer holds, and delivers the rest.

Found in an audit: the member dropped each acquired *range* whose first offset was below the
new log start, whole. One acquire of new records is one range, so a log start moving into its
middle dropped records the log still held: never fetched nor delivered, still locked to the
member at the coordinator until the visibility timeout, then redelivered with a delivery
attempt spent (with `max_delivery_attempts=1`, dead-lettered though nobody ever got them).
"""

from __future__ import annotations

from actors.errors import ErrorCode
from actors.messages import (
    AcquiredRecords, FetchRequest, FetchResponse, ShareAcquireRequest, ShareAcquireResponse,
)
from tests.unit.test_share_member_buffer import GROUPS, LOCKED_UNTIL_MS, Log, Stage, leader


def test_acquired_records_the_log_start_moved_into_are_dropped_only_below_it():
    log = Log(40)
    stage = Stage()
    asked = stage.harness.take(GROUPS, ShareAcquireRequest)
    request = next(request for request in asked if request.partition == 0)
    stage.harness.deliver("member", ShareAcquireResponse(
        correlation_id=request.correlation_id, topic="orders", partition=0, lock_deadline_ms=LOCKED_UNTIL_MS,
        acquired=[AcquiredRecords(first_offset=0, last_offset=9, delivery_count=1)]), GROUPS)
    fetch = stage.harness.take(leader(0), FetchRequest)[-1]
    assert fetch.offset == 0
    # Retention took offsets 0..4 between the acquire and the fetch.
    stage.harness.deliver("member", FetchResponse(
        correlation_id=fetch.correlation_id, topic="orders", partition=0, error=ErrorCode.OFFSET_OUT_OF_RANGE,
        error_message="offset 0 is outside [5, 40]", log_start_offset=5, log_end_offset=40,
        high_watermark=40), leader(0))
    assert sorted(stage.member.held[("orders", 0)]) == [5, 6, 7, 8, 9]

    stage.harness.advance(1_000)
    again = stage.harness.take(leader(0), FetchRequest)[-1]
    assert again.offset == 5
    stage.harness.deliver("member", FetchResponse(
        correlation_id=again.correlation_id, topic="orders", partition=0, high_watermark=40,
        log_start_offset=5, log_end_offset=40, records=log.answer(5, again.max_bytes)), leader(0))
    delivered = [notice.payload[4] for _, notice in stage.harness.notified if notice.kind == "share-records"]
    assert delivered == [[[5, 9, 1]]]
