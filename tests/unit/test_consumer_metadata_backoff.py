"""A consumer whose leader is gone asks the controller who leads now — not in a loop.

Until the controller notices a leader's death (its node agent's exit notice, a session timeout),
its metadata still names the dead leader. A consumer that had just heard the leader's connection
drop distrusts that answer, and before this rule it asked again the moment each answer came: a
metadata request per round trip, hundreds a second at the controller for as long as the death
went unnoticed (the simulator's seeds with node agents showed 1,170 in two runs from one
consumer). Like Kafka's clients (`retry.backoff.ms`), it now waits `RETRY_BACKOFF_MS` after an
answer that did not help; its tick asks again.
"""

from __future__ import annotations

from actors.consumer_client import RETRY_BACKOFF_MS
from actors.messages import FetchRequest, MetadataRequest, PeerDisconnected
from tests.unit.actor_harness import only
from tests.unit.test_consumer_client import BOOTSTRAP, CONSUMER, LEADER, NEW_LEADER, Stage


def test_an_answer_naming_an_unreachable_leader_is_not_asked_again_at_once():
    stage = Stage()
    stage.assigned_at(5)
    effects = stage.harness.deliver(CONSUMER, PeerDisconnected(endpoint=LEADER), b"")
    assert only(effects, MetadataRequest)

    asked = 0
    for _ in range(100):  # one second; the controller keeps naming the dead leader
        if stage.harness.received(BOOTSTRAP, MetadataRequest):
            asked += 1
            effects = stage.metadata(endpoint=LEADER)
            again = [effect for effect in effects if isinstance(getattr(effect, "message", None), MetadataRequest)]
            assert not again, "asked again the moment an unhelpful answer came"
        stage.harness.advance(10)
    assert 2 <= asked <= 1000 // RETRY_BACKOFF_MS + 1, f"{asked} metadata requests in a second"

    stage.metadata(endpoint=NEW_LEADER)  # the controller noticed: the new leader is fetched from
    stage.harness.advance(RETRY_BACKOFF_MS)
    assert only(stage.sent(FetchRequest, NEW_LEADER), FetchRequest).offset == 5
