"""What one frame can make a cluster process build before any rule reads it.

A message is decoded whole before its receiver checks who sent it or what it asks, so the decoder
is where an attacker's bytes turn into memory. A frame of many tiny items is the worst case: 10
million two-letter topic names (30 MB) decoded into 706 MB in 0.6 s, and a topic setting holding
15 million empty lists (15 MB) into 1 GB in 4 s, on one actor's only thread. A request's lists
and maps now have a length the decoder checks before it builds them (actors/wire_bounds.py), and a
cluster process reads a large frame without this cluster's tag only if it is a request: answers,
heartbeats and reports come from inside the cluster.
"""

from __future__ import annotations

import tracemalloc

import msgspec
import pytest

from actors.errors import ErrorCode
from actors.limits import LONG_LIST_MAX, SETTINGS_MAX, Limits
from actors.messages import CreateTopicRequest, MetadataRequest, MetadataResponse, OffsetFetchRequest
from transport.auth import new_secret
from transport.codec import Codec, DecodeFailure

ENCODE = msgspec.msgpack.encode
MB = 1_000_000


def two_letter_names(count: int) -> list[str]:
    return [f"{index % 1296:03x}"[-2:] for index in range(count)]


def refused(outcome: object) -> bool:
    """A typed refusal of a request's frame (one too large to peek at has no correlation id to
    answer to, and is a malformed frame; a smaller one is an invalid request)."""
    return isinstance(outcome, DecodeFailure) and outcome.code in (ErrorCode.MALFORMED_FRAME,
                                                                   ErrorCode.INVALID_REQUEST)


def decoded_with_peak(codec: Codec, frames: list) -> tuple[object, int]:
    """(the message or the DecodeFailure, the most memory the decode held at once)."""
    tracemalloc.start()
    try:
        try:
            outcome: object = codec.decode(frames)
        except DecodeFailure as failure:
            outcome = failure
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_request_naming_more_topics_than_any_request_may_is_refused_before_the_names_are_built():
    frame = ENCODE({"type": "MetadataRequest", "correlation_id": 7, "topics": two_letter_names(1_000_000)})

    outcome, peak = decoded_with_peak(Codec(), [frame])

    assert refused(outcome) and f"length <= {LONG_LIST_MAX}" in str(outcome), outcome
    assert peak < 2 * MB, f"{peak / MB:.1f} MB built for a {len(frame) / MB:.1f} MB frame"


def test_a_request_at_the_bound_still_decodes():
    names = two_letter_names(LONG_LIST_MAX)
    codec = Codec()

    message = codec.decode(codec.encode(MetadataRequest(correlation_id=1, topics=names)))

    assert message.topics == names


def test_a_topic_setting_is_a_single_value_and_a_request_has_a_bounded_number_of_them():
    """A setting of type `any` let one CreateTopic hold 15 million empty lists."""
    nested = ENCODE({"type": "CreateTopicRequest", "correlation_id": 3, "name": "t", "partitions": 1,
                     "config": {"retention_ms": [[]] * 1_000_000}})
    many = ENCODE({"type": "CreateTopicRequest", "correlation_id": 4, "name": "t", "partitions": 1,
                   "config": {f"s{index}": 1 for index in range(SETTINGS_MAX + 1)}})

    refused_nested, peak = decoded_with_peak(Codec(), [nested])
    refused_many, _ = decoded_with_peak(Codec(), [many])

    assert refused(refused_nested) and "got `array`" in str(refused_nested), refused_nested
    assert peak < 2 * MB, f"{peak / MB:.1f} MB built"
    assert refused(refused_many) and f"length <= {SETTINGS_MAX}" in str(refused_many), refused_many
    kept = Codec().decode(Codec().encode(CreateTopicRequest(
        correlation_id=5, name="t", partitions=1, config={"min_insync_replicas": "2", "retention_ms": None})))
    assert kept.config == {"min_insync_replicas": "2", "retention_ms": None}, (
        "a wrong type is the coordinator's to name")


def test_a_large_answer_without_this_clusters_tag_is_refused_unread_by_a_cluster_process():
    """Answers come only from processes of this cluster; a client's codec (no secret) reads them."""
    answer = MetadataResponse(correlation_id=9, controller_endpoints=two_letter_names(1_000_000))
    cluster, client = Codec(secret=new_secret()), Codec()
    forged = client.encode(answer)

    outcome, peak = decoded_with_peak(cluster, forged)

    assert isinstance(outcome, DecodeFailure), outcome
    assert outcome.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, outcome
    assert "MetadataResponse" in str(outcome)
    assert peak < 2 * MB, f"{peak / MB:.1f} MB built for a {len(forged[0]) / MB:.1f} MB frame"
    assert client.decode(forged).controller_endpoints == answer.controller_endpoints
    assert cluster.decode(cluster.encode(answer)).controller_endpoints == answer.controller_endpoints, (
        "this cluster's own answer is read whatever its size")


def test_a_small_answer_without_the_tag_is_left_to_the_receivers_own_rule():
    cluster = Codec(secret=new_secret())

    message = cluster.decode(Codec().encode(MetadataResponse(correlation_id=2)))

    assert isinstance(message, MetadataResponse) and not cluster.last_authenticated


def test_a_repeated_partition_list_of_a_request_is_bounded_too():
    frame = ENCODE({"type": "OffsetFetchRequest", "correlation_id": 1, "group_id": "g",
                    "partitions": [["t", 0]] * (LONG_LIST_MAX + 1)})

    outcome, peak = decoded_with_peak(Codec(), [frame])

    assert refused(outcome) and f"length <= {LONG_LIST_MAX}" in str(outcome), outcome
    assert peak < 2 * MB
    assert isinstance(Codec().decode(Codec().encode(OffsetFetchRequest(
        correlation_id=1, group_id="g", partitions=[("t", 0)] * 10))), OffsetFetchRequest)


@pytest.mark.parametrize("name, value", [
    ("topics_max", LONG_LIST_MAX + 1),
    ("group_offsets_max", LONG_LIST_MAX + 1),
    ("group_members_max", LONG_LIST_MAX + 1),
])
def test_limits_past_what_a_request_may_carry_are_refused(name, value):
    with pytest.raises(ValueError, match=name):
        Limits(**{name: value})
