"""The fault switch's rules: what a link fault matches, and plans it refuses."""

import random

import pytest

from actors.messages import LinkFault
from chaos.links import ActorRef, isolation_plan, peer_prefixes
from transport.faults import FaultSwitch


def test_a_cut_drops_only_matching_peers_in_its_direction():
    switch = FaultSwitch(random.Random(1))
    switch.configure([LinkFault(peers=["tcp://127.0.0.1:6001"], direction="out")])

    assert switch.outbound("tcp://127.0.0.1:6001") is None
    assert switch.inbound("tcp://127.0.0.1:6001") == 0
    assert switch.outbound("tcp://127.0.0.1:6002") == 0


@pytest.mark.parametrize("peers", [[""], ["tcp://127.0.0.1:6001", ""], []])
def test_an_empty_prefix_would_match_every_peer_and_is_refused_leaving_the_links_as_they_were(peers):
    switch = FaultSwitch(random.Random(1))
    switch.configure([LinkFault(peers=["replica/a|"], drop_probability=0.0, delay_ms=5)])

    with pytest.raises(ValueError, match="non-empty peer prefixes"):
        switch.configure([LinkFault(peers=peers)])

    assert switch.outbound("coordinator|1|1") == 0, "an unrelated peer is still reachable"
    assert switch.outbound("replica/a|1|1") == 5_000_000, "the earlier fault still holds"


def test_a_direction_other_than_in_out_or_both_is_refused():
    with pytest.raises(ValueError, match="direction"):
        FaultSwitch(random.Random(1)).configure([LinkFault(peers=["*"], direction="sideways")])


def test_an_actor_whose_endpoint_is_not_known_yet_is_matched_by_its_routing_ids_only():
    assert peer_prefixes(ActorRef("replica/t/0/n2", "", 2)) == ["replica/t/0/n2|"]
    plan = isolation_plan(ActorRef("replica/t/0/n2", "", 2),
                          [ActorRef("replica/t/0/n1", "tcp://127.0.0.1:6001", 1), ActorRef("replica/t/0/n2", "", 2)])
    assert all(prefix for links in plan.values() for link in links for prefix in link.peers)
