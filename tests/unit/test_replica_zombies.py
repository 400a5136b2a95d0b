"""A follower's earlier process that comes back: the leader counts only the process on record.

The story (docs/security.md, "Zombie followers"): a follower process is paused; its node loses the
disk and starts a new process of the replica on an empty one, which repairs from the leader and
joins the ISR again. Then the paused process resumes. It still holds everything it had and can
fetch at the leader's end, so before this rule its fetches counted as the node's: the leader moved
its high watermark and acknowledged acks=all writes that the node's process on record — the one
the coordinator may elect — did not hold. The coordinator records which incarnation of each ISR
member joined, partition states carry it, and a leader answers a follower fetch of another
incarnation of an ISR member with STALE_BROKER_EPOCH and counts nothing from it.
"""

from __future__ import annotations

from actors.effects import Send
from actors.errors import ErrorCode
from actors.messages import FetchRequest, FetchResponse
from storage.log import LogConfig
from storage.memory import MemoryFileSystem, open_memory_log
from tests.unit.actor_harness import only
from tests.unit.test_replica_replication import LIMITS, Cluster, endpoint


def _followers(cluster: Cluster) -> list[int]:
    return [node for node in (1, 2, 3) if node != cluster.leader]


def _zombie_fetch(cluster: Cluster, node: int, incarnation: int) -> FetchResponse:
    """What the resumed process sends: its old incarnation, at the leader's end (it holds it all)."""
    leader = cluster.replicas[cluster.leader]
    epoch = leader.state.leader_epoch
    request = FetchRequest(correlation_id=77, topic="orders", topic_id=cluster.topic_id, partition=0,
                           offset=leader.log.log_end_offset, leader_epoch=epoch, replica=node,
                           last_fetched_epoch=epoch, incarnation=incarnation, max_wait_ms=0)
    effects = cluster.harness.deliver(endpoint(cluster.leader), request, "zombie")
    return only([effect.message for effect in effects if isinstance(effect, Send) and effect.to == "zombie"],
                FetchResponse)


def _replace_after_disk_loss(cluster: Cluster, node: int):
    """Pause the node's process (it hears and says nothing) and start a new one on an empty disk;
    let it repair and rejoin the ISR. Returns the paused one."""
    paused = cluster.harness.remove(endpoint(node))
    cluster.disks[node] = MemoryFileSystem()
    cluster.logs[node] = open_memory_log(LogConfig(), fs=cluster.disks[node])
    fresh = cluster.start_replica(node)
    cluster.settle(LIMITS.replica_lag_time_max_ms + 1_000)
    record = cluster.coordinator.partitions[("orders", 0)]
    assert node in record.isr and record.isr_incarnations[node] == fresh.incarnation, record
    return paused


def test_a_resumed_earlier_process_of_an_isr_follower_is_refused_and_acknowledges_nothing():
    cluster = Cluster()
    cluster.produce("a", count=2)
    node = _followers(cluster)[0]
    paused = _replace_after_disk_loss(cluster, node)
    leader = cluster.leader
    fresh_end = cluster.logs[node].log_end_offset
    # The new process falls behind (cut from the leader); the old one resumes and keeps up.
    cluster.harness.cut(endpoint(node), endpoint(leader))
    cluster.produce("x")
    answer = _zombie_fetch(cluster, node, paused.incarnation)
    cluster.harness.run()

    assert answer.error == ErrorCode.STALE_BROKER_EPOCH, answer
    assert not answer.records
    assert cluster.replicas[leader].high_watermark <= fresh_end
    assert [response.error for response in cluster.acknowledged()] == [ErrorCode.NONE]  # "a" only, not "x"


def test_once_the_current_process_leaves_the_isr_the_write_is_acknowledged_without_it():
    """Refusing the old process costs no availability: the node on record falls out of the ISR as
    any lagging follower does, and the write is acknowledged by the others."""
    cluster = Cluster()
    cluster.produce("a")
    node = _followers(cluster)[0]
    paused = _replace_after_disk_loss(cluster, node)
    cluster.harness.cut(endpoint(node), endpoint(cluster.leader))
    cluster.produce("x")
    for _ in range(10):
        _zombie_fetch(cluster, node, paused.incarnation)
        cluster.settle(LIMITS.replica_lag_time_max_ms / 5)

    assert node not in cluster.coordinator.partitions[("orders", 0)].isr
    assert [response.error for response in cluster.acknowledged()] == [ErrorCode.NONE, ErrorCode.NONE]
    assert cluster.logs[node].log_end_offset < cluster.logs[cluster.leader].log_end_offset


def test_a_follower_restarted_on_its_disk_is_counted_once_the_coordinator_records_it():
    """The same rule must not stall a follower that restarts cleanly and stays in the ISR: its new
    incarnation is recorded and announced, then its fetches count again."""
    cluster = Cluster()
    cluster.produce("a", count=2)
    node = _followers(cluster)[0]
    old = cluster.harness.remove(endpoint(node))
    cluster.logs[node].close()  # a clean stop: flushed, and the checkpoint says so
    cluster.logs[node] = open_memory_log(LogConfig(), fs=cluster.disks[node])
    assert cluster.logs[node].clean_shutdown
    fresh = cluster.start_replica(node)
    assert fresh.incarnation != old.incarnation
    cluster.settle(1_000)

    record = cluster.coordinator.partitions[("orders", 0)]
    assert node in record.isr and record.isr_incarnations[node] == fresh.incarnation
    leader_state = cluster.replicas[cluster.leader].state
    assert dict(zip(leader_state.isr, leader_state.isr_incarnations))[node] == fresh.incarnation
    cluster.produce("b")
    assert [response.error for response in cluster.acknowledged()] == [ErrorCode.NONE, ErrorCode.NONE]
    assert cluster.logs[node].log_end_offset == cluster.logs[cluster.leader].log_end_offset
