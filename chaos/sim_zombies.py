"""A zombie follower: a replica's earlier process that comes back after its node replaced it.

The story (docs/security.md, "Zombie followers"), as one fault of the simulator (`zombie`, only
when named, so the recorded histories of the default faults stay as they are): a follower's
process is paused; its node agent dies, and the new agent finds the replica's disk lost and starts
a new process on an empty one, which repairs from the leader and rejoins the ISR. Then the paused
process resumes. It holds everything it had, its sockets are still connected (a paused process
keeps its TCP connections), and it fetches at the leader's end and reports to its node — until it
notices its agent is gone and exits.

Here the paused process moves to a host of its own (`<replica>~zombie<incarnation>`, kind
`replica-zombie`) keeping its actor, endpoint, timers and memory disk, while the replica's host
gets an empty disk and boots a new incarnation after the usual restart delay, with no exit notice
(the agent died too). The zombie is paused for 1.5-4 s and lives 0-1.5 s after it resumes.

The checks stay the simulator's: a zombie is no replica of its partition (its disk is lost), so an
acknowledged acks=all write it alone held is one held by too few replicas (chaos/sim_invariants.py
`_holds` knows its incarnation as a zombie's), and every leader and epoch it names is checked as
any other's. The lost disk follows the disk faults' rules (chaos/sim_disk.py): one damaged replica
per partition at a time, never the only one the coordinator trusts with every committed write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.sim_hosts import Host, SimFaultInjector
from chaos.sim_network import MS
from storage.memory import MemoryFileSystem

if TYPE_CHECKING:
    from chaos.sim_disk import DiskFaults
    from chaos.simulator import Simulator

ZOMBIE_KIND = "replica-zombie"
# In a replica host's state: its zombies' actor incarnations -> their log end when they were left behind.
ZOMBIES = "zombies"
ZOMBIE_PAUSE_MS = (1500, 4000)  # long enough for the new process to repair and rejoin the ISR
ZOMBIE_LIFE_MS = (0, 1500)  # after it resumes, until it notices its agent is gone


def make_zombie(sim: "Simulator", disk: "DiskFaults") -> str | None:
    """Turn a running follower into a paused zombie and start its replacement on an empty disk;
    the zombie's name, or None when no follower may lose its disk now."""
    candidates = [name for name in disk.candidates() if sim.hosts[name].actor.follower is not None
                  and sim.hosts[name].paused_until_ns <= sim.now_ns]
    if not candidates:
        return None
    host = sim.hosts[disk.rng.choice(candidates)]
    key = host.state["topic_partition"]
    zombie = _take_process(sim, host)
    zombie.paused_until_ns = sim.now_ns + disk.rng.randint(*ZOMBIE_PAUSE_MS) * MS
    life_ns = disk.rng.randint(*ZOMBIE_LIFE_MS) * MS
    sim.schedule(zombie.paused_until_ns + life_ns, lambda: _exit(sim, zombie))
    disk.took_fault(host.name, key, "zombie")
    sim.faults.lost_data_ns[key] = sim.now_ns
    sim.note(f"{host.name}#{zombie.incarnation} is paused and left behind as {zombie.name}; "
             f"its node starts a new process on an empty disk")
    sim.schedule(sim.now_ns + sim.config.restart_delay_ms * MS, lambda: sim.restart(host.name))
    return zombie.name


def _take_process(sim: "Simulator", host: Host) -> Host:
    """Move the running process of `host` to a zombie host of its own; `host` is left down, with an
    empty disk. Nothing the process holds changes, and nobody sees a connection drop."""
    zombie = Host(f"{host.name}~zombie{host.incarnation}", ZOMBIE_KIND, host.node, host.factory)
    zombie.faults, zombie.fs = host.faults, host.fs
    zombie.actor, zombie.incarnation, zombie.alive = host.actor, host.incarnation, True
    zombie.endpoint = host.endpoint
    zombie.routing_id = host.routing_id + b"~zombie" + str(host.incarnation).encode()
    zombie.reply_address = zombie.routing_id + b"#" + str(zombie.incarnation).encode()
    zombie.timers = dict(host.timers)
    zombie.peers = set(host.peers)
    zombie.clock_offset_ns = host.clock_offset_ns
    zombie.state["topic_partition"] = host.state["topic_partition"]
    host.state.setdefault(ZOMBIES, {})[host.actor.incarnation] = host.actor.log.log_end_offset
    host.faults = SimFaultInjector()
    host.fs = MemoryFileSystem(host.faults)
    host.crash()  # the host's new, empty disk forgets nothing: it holds nothing yet
    sim.hosts[zombie.name] = zombie
    sim.by_routing[zombie.routing_id] = zombie
    if zombie.endpoint:
        sim.by_endpoint[zombie.endpoint] = zombie
    sim.requeue_timers(zombie)
    return zombie


def _exit(sim: "Simulator", zombie: Host) -> None:
    """The zombie notices its agent is gone and exits: its connections drop."""
    if not zombie.alive:
        return
    sim.note(f"{zombie.name} exits")
    zombie.alive = False
    zombie.actor = None
    zombie.timers = {}
    sim.disconnect_peers(zombie, zombie.endpoint)  # it stays a host, dead: what is on its way is dropped
