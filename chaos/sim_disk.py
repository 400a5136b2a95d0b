"""Disk faults for the simulator: a replica loses or damages what it had flushed, then restarts.

One fault, chosen by the run's random generator, hits one replica process:

    lose-tail-segment   the newest segment file is gone (a lost or unreadable file)
    lose-segment        a random segment file is gone (a hole in the middle of the log)
    flip-byte           one byte of a flushed segment is flipped (bit rot; header or payload)
    wipe                every file of the replica's directory is gone (a replaced disk)
    lose-checkpoints    the recovery-point and leader-epoch checkpoints are gone

The replica is crashed (its unflushed tail is lost too, as in any crash) and restarted after the
usual delay. With probability `restart_cluster_probability` the whole cluster goes down with it
instead — the coordinator crashed, every other replica of the partition stopped as `railmq down`
stops it (its log flushed first: a second replica losing data in the same instant is beyond the
promise), and no exit notice reaches anyone (the node agent died too) — and comes back with the
coordinator first and the replicas in a
random order over more than the coordinator's grace: the restart in which an election that
trusted whoever reports first (or last) would pick the damaged replica.

A controller can lose its disk too (`lose_voter_disk`, the fault `voter-disk`, only when named):
it crashes, every file of its Raft directory is gone, and it comes back with a new journal marked
*rejoining* (docs/raft.md §7), as transport/actor_build.py opens one for a voter whose quorum had
formed. One lost log at a time: never while another controller is still rejoining.

The promise checked: no acknowledged write is lost while a majority of its replicas keep their data.
So at most one replica of a partition is damaged at a time: a partition gets a new disk fault only
once its last damaged replica has reported healthy again (its `storage-repaired` or
`storage-adopted` trace, or a healthy start) and the coordinator has it back in the ISR, and never
hits the only replica the coordinator trusts with every committed write (the ISR's last member,
with no ELR). In a seed whose topics flush by interval, a disk
fault also waits until no other replica of the partition lost unflushed data recently
(chaos/sim_faults.py), and the whole cluster never restarts at once (every replica would lose its
unflushed tail together).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from chaos.sim_faults import STOP_WAIT_MAX_MS
from chaos.sim_hosts import CONTROLLER_DIRECTORY, LOST_DISK, REPLICA_DIRECTORY
from chaos.sim_network import MS
from storage.raft_records import HEADER_BYTES, LOG_NAME, choose_slot
from storage.segment import parse_segment_file_name

if TYPE_CHECKING:
    from chaos.sim_hosts import Host
    from chaos.simulator import Simulator

DISK_FAULTS = ("lose-tail-segment", "lose-segment", "flip-byte", "wipe", "lose-checkpoints")


class DiskFaults:
    def __init__(self, sim: "Simulator", rng: random.Random, restart_cluster_probability: float = 0.5) -> None:
        self.sim = sim
        self.rng = rng
        self.restart_cluster_probability = restart_cluster_probability
        self.damaged: dict[tuple[str, int], str] = {}  # partition -> the damaged replica's host name
        self.repaired: set[tuple[str, int]] = set()  # partitions whose damaged replica reported healthy
        self.faults_of: dict[tuple[str, int], str] = {}  # partition -> the fault its damaged replica took
        self.injected: list[tuple[str, str]] = []  # (host, fault), in order

    def on_trace(self, host: "Host", event: str, details: dict) -> None:
        """A damaged replica that reports healthy, once back in the ISR, frees its partition for
        the next disk fault (`free`)."""
        key = host.state.get("topic_partition")
        if key is None or self.damaged.get(key) != host.name:
            return
        # A flipped byte is found only when a read meets it (the scrubber, a fetch): a start that
        # says "ok" has not repaired it (seed 80819 gave the partition's other ISR member a second
        # disk fault while the flipped byte still waited to be found).
        started_ok = event == "replica-started" and details.get("storage") == "ok" and \
            self.faults_of.get(key) != "flip-byte"
        if (event in ("storage-repaired", "storage-adopted") and details.get("state") == "ok") or started_ok:
            self.repaired.add(key)

    def free(self, key: tuple[str, int]) -> bool:
        """Whether the partition may take a disk fault: its last damaged replica is healthy and back
        in the ISR. Healthy alone is not enough: until it rejoins, the ISR may be one replica, and
        losing that one's disk is two replicas' worth of loss, beyond the promise (seed 61399:
        repaired 385 ms before the second fault, its seat refused, then asked for again and lost)."""
        name = self.damaged.get(key)
        if name is None:
            return True
        coordinator = self.sim.coordinator()
        record = coordinator.partitions.get(key) if coordinator is not None else None
        if key not in self.repaired or record is None or self.sim.hosts[name].node not in record.isr:
            return False
        del self.damaged[key]
        self.repaired.discard(key)
        return True

    def _not_the_only_holder(self, host: "Host") -> bool:
        """Whether the coordinator knows another replica holding every committed write (an ISR or
        ELR member): losing the disk of the only one is two replicas' worth of loss when the others
        left the ISR by losing their unflushed tails or falling behind, beyond the promise (seed
        2387 of a denser-fault sweep: the ISR was [3] after node 2 died in a flush, and node 3's
        disk went; the partition stayed offline, by design). A paused replica does not count: it
        may be dropped from the ISR as dead before it resumes (seed 3685 of the same sweep: node 2
        paused, node 3 dead, node 1's disk wiped; the coordinator dropped node 2, then node 3 for
        its unclean restart, and the ISR was node 1 alone, with nothing on its disk)."""
        coordinator = self.sim.coordinator()
        topic, partition = key = host.state["topic_partition"]
        record = coordinator.partitions.get(key) if coordinator is not None else None
        if record is None:
            return True
        trusted = {**record.elr, **{node: record.isr_incarnations.get(node, 0) for node in record.isr}}
        for node, incarnation in trusted.items():
            peer = self.sim.hosts.get(f"replica/{topic}/{partition}/n{node}")
            # The incarnation the coordinator trusts, still running (0: not yet seen, any one).
            if node != host.node and peer is not None and peer.alive and peer.paused_until_ns <= self.sim.now_ns \
                    and incarnation in (0, peer.actor.incarnation):
                return True
        return False

    def inject(self, target: str | None = None) -> str | None:
        """Damage one replica (a random one, or `target`); returns what was done, or None when no
        partition may take a fault now."""
        sim = self.sim
        candidates = self.candidates()
        if target is not None:
            candidates = [name for name in candidates if name == target]
        if not candidates:
            return None
        leaders = [name for name in candidates if sim.hosts[name].actor.leader is not None]
        # Half the time the leader's disk: the replica an election that trusts old news would keep.
        name = self.rng.choice(leaders if leaders and self.rng.random() < 0.5 else candidates)
        host = sim.hosts[name]
        fault = self.rng.choice(DISK_FAULTS)
        key = host.state["topic_partition"]
        # The whole cluster stops around the damaged replica only if its other replicas can stop
        # cleanly: one paused past `railmq down`'s wait is killed, and its unflushed tail is lost
        # with the damaged replica's data — two replicas' worth at once (seed 2097 of a denser
        # fault sweep left the partition with neither an ISR member nor an ELR member to elect).
        whole_cluster = self.rng.random() < self.restart_cluster_probability and not any(
            peer.paused_until_ns > sim.now_ns + STOP_WAIT_MAX_MS * MS for other, peer in sim.hosts.items()
            if other != name and peer.kind == "replica" and peer.alive and peer.state["topic_partition"] == key)
        sim.crash(name, restart=False, notify=not whole_cluster)
        if not self._damage(host, fault):
            sim.queue.push(sim.now_ns + sim.config.restart_delay_ms * MS, "call", lambda: sim.restart(name))
            return None
        self.took_fault(name, key, fault)
        sim.note(f"disk fault {fault} on {name}")
        if not whole_cluster:
            sim.queue.push(sim.now_ns + sim.config.restart_delay_ms * MS, "call", lambda: sim.restart(name))
            return fault
        restarting = [name] + [other for other, peer in sorted(sim.hosts.items())
                               if peer.kind == "replica" and peer.alive and peer.state["topic_partition"] == key]
        # The others are stopped, not cut from power: an operator restarting the cluster around a
        # node whose disk failed. A crash here would lose their unflushed tails in the same
        # instant as the damaged replica's data — two replicas of the partition losing data at
        # once, which is beyond what railmq promises to survive (chaos/sim_faults.py).
        for other in restarting[1:]:
            sim.stop(other)
        controllers = [host.name for host in sim.controller_hosts()]
        for controller in controllers:
            sim.crash(controller, restart=False)
        sim.note(f"the cluster restarts: {controllers}, then {restarting} in a random order")
        for controller in controllers:
            sim.queue.push(sim.now_ns + sim.config.restart_delay_ms * MS, "call",
                           lambda controller=controller: sim.restart(controller))
        self.rng.shuffle(restarting)
        spread_ms = 2 * sim.config.limits.coordinator_election_grace_ms
        for member in restarting:
            delay_ms = sim.config.restart_delay_ms + self.rng.randint(0, spread_ms)
            sim.queue.push(sim.now_ns + delay_ms * MS, "call", lambda member=member: sim.restart(member))
        return fault

    def candidates(self) -> list[str]:
        """The replicas that may lose their disk now, by name."""
        sim = self.sim
        return sorted(name for name, host in sim.hosts.items()
                      if host.kind == "replica" and host.alive and self.free(host.state["topic_partition"])
                      and sim.faults.may_lose_data(name) and self._not_the_only_holder(host))

    def took_fault(self, name: str, key: tuple[str, int], fault: str) -> None:
        """`name` lost or damaged its disk: its partition takes no other disk fault until it is back."""
        self.damaged[key] = name
        self.faults_of[key] = fault
        self.repaired.discard(key)
        self.injected.append((name, fault))

    def lose_voter_disk(self) -> str | None:
        """A controller loses its disk and restarts; returns its name, or None when none may."""
        sim = self.sim
        voters = [host for host in sim.controller_hosts() if host.kind == "controller"]
        if not voters or any(_rejoining(host) for host in voters):
            return None
        host = self.rng.choice(voters)
        sim.crash(host.name)  # it restarts after the usual delay
        for path in host.fs.durable_paths(CONTROLLER_DIRECTORY + "/"):
            host.fs.destroy(path)
        host.state[LOST_DISK] = True
        sim.note(f"{host.name}'s disk is lost")
        return host.name

    def _damage(self, host: "Host", fault: str) -> bool:
        fs = host.fs
        files = fs.durable_paths(REPLICA_DIRECTORY + "/")
        segments = [path for path in files if parse_segment_file_name(path.rsplit("/", 1)[1]) is not None
                    and fs.durable_content(path)]
        if fault == "wipe":
            for path in files:
                fs.destroy(path)
            return bool(files)
        if fault == "lose-checkpoints":
            lost = [path for path in files if path.endswith("-checkpoint")]
            for path in lost:
                fs.destroy(path)
            return bool(lost)
        if not segments:
            return False
        if fault == "lose-tail-segment":
            fs.destroy(segments[-1])
        elif fault == "lose-segment":
            fs.destroy(self.rng.choice(segments))
        else:
            path = self.rng.choice(segments)
            fs.corrupt(path, self.rng.randrange(len(fs.durable_content(path))))
        return True


def _rejoining(host: "Host") -> bool:
    """A controller that lost its disk and is not caught up yet: running, as it says; down, as its
    disk will bring it back."""
    if host.state.get(LOST_DISK):
        return True
    if host.alive:
        return host.actor.raft.rejoining
    journal = host.fs.durable_content(f"{CONTROLLER_DIRECTORY}/{LOG_NAME}")
    return bool(journal) and choose_slot(journal[:HEADER_BYTES], LOG_NAME)[0].rejoining
