"""A replica that led an epoch without writing a batch in it, then follows a leader that never had
that epoch (the simulator's finding): its leader-epoch checkpoint ends with an entry starting at
its log end, while it fetches with the epoch of its last batch. The leader, seeing nothing
diverge, sends batches of that older epoch from the follower's log end; they must replace the
empty epoch (Kafka's LeaderEpochFileCache.assign drops every entry at or past a new batch's
start). Refusing them as a stale epoch crashed the replica on every fetch, restart after restart,
and it never came back to the ISR."""

from __future__ import annotations

from actors.effects import Crash
from actors.messages import PartitionState, ReplicaHeartbeatResponse, TopicConfig
from actors.partition_replica import PartitionReplica
from storage.log import LogConfig
from storage.memory import MemoryFileSystem, open_memory_log
from tests.unit.actor_harness import Harness
from tests.unit.test_replica_replication import COORDINATOR, LIMITS, batch, endpoint, log_bytes, tags_in


def test_a_follower_that_led_an_empty_epoch_takes_the_next_leaders_older_epoch_batches():
    harness = Harness()
    fs = MemoryFileSystem()
    leader_log, follower_log = open_memory_log(LogConfig(), fs=MemoryFileSystem()), open_memory_log(LogConfig(), fs=fs)
    for tag, count in (("a", 4), ("b", 3)):
        leader_log.append_producer_batch(batch(count, tag), 0, 0)
    follower_log.append_producer_batch(batch(4, "a"), 0, 0)
    follower_log.assign_epoch(1, 4)  # it led epoch 1 and crashed before writing anything
    replicas = {node: PartitionReplica(
        topic="orders", topic_id=1, partition=0, node=node, endpoint=endpoint(node), coordinator=COORDINATOR,
        log=log, config=TopicConfig(), incarnation=node, limits=LIMITS)
        for node, log in ((1, follower_log), (2, leader_log))}
    for node, replica in replicas.items():
        harness.add(endpoint(node), replica)
    state = PartitionState(topic="orders", topic_id=1, partition=0, leader=2, leader_endpoint=endpoint(2),
                           leader_epoch=2, partition_epoch=2, replicas=[1, 2], isr=[2])

    for node in (2, 1):
        harness.deliver(endpoint(node), ReplicaHeartbeatResponse(state=state), COORDINATOR)
    harness.run()

    crashes = [effect for step in harness.steps for effect in step.effects if isinstance(effect, Crash)]
    assert crashes == [], "the follower refused the leader's batches"
    assert log_bytes(follower_log) == log_bytes(leader_log) and tags_in(follower_log) == ["a-0", "b-0"]
    assert follower_log.epoch_entries() == [(0, 0)], "the empty epoch 1 is gone, from the checkpoint too"
    reopened = open_memory_log(LogConfig(), fs=fs)
    assert reopened.epoch_entries() == [(0, 0)] and reopened.log_end_offset == 7
