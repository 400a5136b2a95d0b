"""The faults the simulator injects into a running cluster, and the flush model they act on.

Every `fault_interval_ms` one fault, chosen by the run's random generator, hits one process (a
role, then a process of that role):

    crash        the process dies (its memory disk forgets what was never fsynced) and restarts
                 after `restart_delay_ms` with a new incarnation. A replica's exit notice from the
                 node agent arrives ~60 ms later, or late (after the restart: the coordinator
                 may hear of the new incarnation first), or never (the agent died too: a
                 restart nobody reported, seen only through the heartbeats)
    pause        the process stops for 0.2-3 s (longer than every session timeout) and resumes
    partition    one process cut off both ways or one way, or the nodes split in two
    network      drops, duplicates and slow messages for a while
    disk         a replica loses or damages flushed data (chaos/sim_disk.py)
    voter-disk   (only when named) a controller loses its disk and comes back marked rejoining
                 (chaos/sim_disk.py `lose_voter_disk`)
    zombie       (only when named) a follower is paused, its node replaces it on an empty disk,
                 then it resumes for a while (chaos/sim_zombies.py)
    disk-full    (only when named) the disk of a process that keeps data takes no new space for
                 a while, a partition leader's half the time: its writes fail `StorageFull` (a
                 leader answers `DISK_FULL`, so an idempotent producer's batch ends undelivered and
                 leaves a gap in its numbers; a follower waits and leaves the ISR; a write the
                 process cannot do without stops it, exit 73, and it is started again later: its
                 machine keeps what it wrote), then space comes back
    clock        the process's clock jumps, staying within `clock_skew_max_ms` of the true time
    slow-disk    each flush of the process takes 5-200 ms for a while: it is busy (handles
                 nothing) meanwhile, and what an AfterFlush guards waits for it; a flush the
                 actor makes inline (an interval flush timer) keeps it busy as long
    flush-crash  the process is killed in the middle of its next flush: after 0-2 more fsyncs
                 succeed (a segment synced, its checkpoint not), the next one fails

Flushes: an `AfterFlush` on a host with a fast disk flushes and applies its effects at once; on a
slow disk (or behind a flush still running) it completes later, in order, and a crash before it
completes loses both the unflushed data and the effects it guarded.

The promise checked is the one railmq makes: no acknowledged write is lost while a majority of a
partition's replicas keep their data. A topic flushed by interval keeps data a crash can lose
(the unflushed tail), so in such a seed two replicas of one partition never lose data (crash,
disk fault, flush crash) within `unflushed_window_ms` of each other: that is enough time for
every other replica, even one paused meanwhile, to have flushed what it held. And whatever the
flush policy, no replica is killed while another of its partition waits to repair a damaged disk.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from actors.messages import ReplicaExited, Stop
from chaos.sim_network import MS

if TYPE_CHECKING:
    from chaos.sim_hosts import Host
    from chaos.simulator import Simulator

PAUSE_MS = (200, 3000)
# A fault's target: a role first (replicas three times as often as each other role, as there are
# many), then one process of it — so the coordinators and each kind of client are hit as often as
# the faults that only they can reveal need (a group coordinator crash every few seeds).
TARGET_ROLES = ("replica", "replica", "replica", "coordinator", "controller", "group-coordinator", "producer", "consumer",
                "share")
SLOW_DISK_LATENCY_MS = (5, 200)
DATA_KINDS = ("replica", "coordinator", "controller", "group-coordinator")  # the processes with a disk
EXIT_NOTICE_DELAY_MS = 60
# How long a stop (`railmq down`) waits for a busy process before it kills it: less than the
# restart delay, so the process is gone before the cluster comes back.
STOP_WAIT_MAX_MS = 250
LATE_NOTICE_MS = (50, 800)  # after the restart


class Faults:
    def __init__(self, sim: "Simulator", rng: random.Random) -> None:
        self.sim = sim
        self.rng = rng
        self.active = True
        self.lost_data_ns: dict[tuple[str, int], int] = {}  # partition -> when a replica last lost data
        self.unflushed_window_ns = (sim.plan.flush_interval_ms + PAUSE_MS[1] + 500) * MS

    # ------------------------------------------------------------------ crashes and exit notices

    def crash(self, name: str, restart: bool = True, notify: bool = True, keep_writes: bool = False) -> None:
        """Kill a process (with `keep_writes`, it exited: its machine keeps what it wrote)."""
        sim = self.sim
        host = sim.hosts[name]
        if not host.alive:
            return
        sim.note(f"{'exit' if keep_writes else 'crash'} {name}#{host.incarnation}")
        shell = sim.shells.get(name)
        if shell is not None:
            shell.crashed(sim.now_ns)
        endpoint = host.endpoint
        incarnation = getattr(host.actor, "incarnation", 0)
        sim.watch.before_crash(host)
        host.crash(keep_writes)
        sim.watch.on_crash(host)
        sim.disconnect_peers(host, endpoint)
        if host.kind == "replica":
            if not keep_writes:
                self.lost_data_ns[host.state["topic_partition"]] = sim.now_ns
            if notify:
                self._exit_notice(host, incarnation)
        if restart:
            sim.schedule(sim.now_ns + sim.config.restart_delay_ms * MS, lambda: sim.restart(name))

    def stop(self, name: str) -> None:
        """Stop a host as `railmq down` does: the actor gets its Stop (a replica flushes its log),
        then the process is gone, without an exit notice (its node agent stops too)."""
        host = self.sim.hosts[name]
        self._stop_when_able(host, host.incarnation, self.sim.now_ns + STOP_WAIT_MAX_MS * MS, stopped=False)

    def _stop_when_able(self, host: "Host", incarnation: int, deadline_ns: int, *, stopped: bool) -> None:
        """`railmq down` asks a process to stop and waits for it to exit, up to a deadline, then
        kills it: a process busy in fsync (a slow disk) handles its Stop once the fsync returns,
        and exits once the flushes the Stop began (the log, the clean-shutdown mark) are done."""
        sim = self.sim
        if not host.alive or host.incarnation != incarnation:
            return
        busy = host.paused_until_ns > sim.now_ns or host.flushes_pending
        if busy and sim.now_ns < deadline_ns:
            at = min(max(host.paused_until_ns, host.flush_done_ns, sim.now_ns + MS), deadline_ns)
            sim.schedule(at, lambda: self._stop_when_able(host, incarnation, deadline_ns, stopped=stopped))
            return
        if not busy and not stopped:
            sim._internal(host, [Stop(reason="the cluster is stopping")])
            if host.alive and host.flushes_pending:
                self._stop_when_able(host, incarnation, deadline_ns, stopped=True)
                return
        self.crash(host.name, restart=False, notify=False)

    def _reaped(self, host: "Host", incarnation: int) -> None:
        """The node agent notices the exit (its supervisor's wait) and drops the replica's report,
        whether or not its notice reaches the controller."""
        agent = self.sim.node_agent(host.node)
        if agent is None:
            return
        topic, partition = host.state["topic_partition"]

        def forget() -> None:
            if agent.alive:
                agent.actor.forget(topic, partition, incarnation)
        self.sim.schedule(self.sim.now_ns + EXIT_NOTICE_DELAY_MS * MS, forget)

    def _exit_notice(self, host: "Host", incarnation: int) -> None:
        sim = self.sim
        config = sim.config
        roll = self.rng.random()
        self._reaped(host, incarnation)
        if roll < config.exit_notice_lost_probability:
            sim.note(f"the exit notice of {host.name}#{incarnation} is lost")
            return
        delay_ms = EXIT_NOTICE_DELAY_MS
        if roll < config.exit_notice_lost_probability + config.exit_notice_late_probability:
            delay_ms = config.restart_delay_ms + self.rng.randint(*LATE_NOTICE_MS)
        topic, partition = host.state["topic_partition"]
        notice = ReplicaExited(topic=topic, partition=partition, node=host.node, incarnation=incarnation)
        agent = sim.node_agent(host.node)
        if agent is None:
            sim.schedule(sim.now_ns + delay_ms * MS,
                         lambda: sim.send_as("agent", sim.agent_controller(), notice))
            return

        def tell() -> None:  # from the node's agent, which reaped the process and forgot it
            if agent.alive:
                sim.send_as(agent.name, agent.actor.controllers.current, notice)
        sim.schedule(sim.now_ns + delay_ms * MS, tell)

    def may_lose_data(self, name: str) -> bool:
        """Whether `name` may lose unflushed or flushed data now (see the module docstring).

        Never while another replica of its partition has a damaged disk not repaired yet, whatever
        the flush policy: a replica killed then is one the coordinator cannot know lost nothing
        (an unclean restart leaves the ELR, KIP-966), so with the damaged one it is two replicas'
        worth (seed 5140 of a denser sweep with five nodes, flushing every batch: a flipped byte
        waited for a leader to repair from, the ELR member was killed, the third replica had left
        the ISR, and nothing was left to elect)."""
        host = self.sim.hosts[name]
        if host.kind != "replica":
            return True
        key = host.state["topic_partition"]
        if self.sim.disk.damaged.get(key, name) != name and not self.sim.disk.free(key):
            return False
        if self.sim.plan.flush_policy != "interval":
            return True
        last = self.lost_data_ns.get(key)
        return last is None or self.sim.now_ns - last > self.unflushed_window_ns

    # ------------------------------------------------------------------ flushes

    def after_flush(self, host: "Host", effect: Any, rest: list) -> str:
        """Apply an `AfterFlush`, then `rest` (the effects after it in the same step), as the
        runtime does: the flush first, then each effect in order. "applied": done now, the caller
        goes on with `rest`; "deferred": a slow disk, or a flush still in progress, holds the
        process in fsync — the guarded effects and `rest` are applied when it completes, in the
        order the flushes began; "died": the process died in the middle of the flush."""
        sim = self.sim
        now = sim.now_ns
        if host.disk_latency_ns == 0 and not host.flushes_pending:
            if not sim.flush_now(host, effect.store):
                return "died"
            sim._apply(host, list(effect.effects))
            return "applied" if host.alive else "died"
        done = max(host.flush_done_ns, now) + host.disk_latency_ns
        host.flush_done_ns = done
        host.flushes_pending += 1
        host.paused_until_ns = max(host.paused_until_ns, done)  # busy: it handles nothing meanwhile
        incarnation = host.incarnation
        effects = list(effect.effects) + list(rest)
        sim.schedule(done, lambda: self._complete_flush(host, incarnation, effect.store, effects))
        return "deferred"

    def _complete_flush(self, host: "Host", incarnation: int, store: Any, effects: list) -> None:
        if not host.alive or host.incarnation != incarnation:
            return
        host.flushes_pending -= 1
        if self.sim.flush_now(host, store):
            self.sim.apply_later(host, incarnation, effects)

    # ------------------------------------------------------------------ the schedule

    def schedule_next(self) -> None:
        if not self.active:
            return
        low, high = self.sim.config.fault_interval_ms
        self.sim.schedule(self.sim.now_ns + self.rng.randint(low, high) * MS, self._inject)

    def _inject(self) -> None:
        if not self.active:
            return
        sim = self.sim
        kind = self.rng.choice(sim.config.faults)
        kinds = {host.kind for host in sim.hosts.values()}
        role = self.rng.choice([role for role in TARGET_ROLES if role in kinds])
        target = self.rng.choice(sorted(name for name, host in sim.hosts.items() if host.kind == role))
        duration_ms = self.rng.randint(*PAUSE_MS)
        line = {"type": "fault", "time_ns": sim.now_ns, "nemesis": kind, "target": target, "phase": "start"}
        sim.history.append(line)
        if kind in ("crash", "flush-crash") and not self.may_lose_data(target):
            line.update(target="", fault="none")
        elif kind == "crash":
            self.crash(target)
        elif kind == "disk":
            done = sim.disk.inject()
            line.update(target=sim.disk.injected[-1][0] if done else "", fault=done or "none")
        elif kind == "zombie":
            from chaos.sim_zombies import make_zombie

            made = make_zombie(sim, sim.disk)
            line.update(target=made or "", fault="zombie" if made else "none")
        elif kind == "voter-disk":
            lost = sim.disk.lose_voter_disk()
            line.update(target=lost or "", fault="voter-disk" if lost else "none")
        elif kind == "pause":
            host = sim.hosts[target]
            host.paused_until_ns = max(host.paused_until_ns, sim.now_ns + duration_ms * MS)
            sim.note(f"pause {target} for {duration_ms} ms")
        elif kind == "partition":
            self._partition(target, duration_ms)
        elif kind == "network":
            sim.network.faults = replace(sim.network.faults, drop_probability=0.05, duplicate_probability=0.05,
                                         slow_probability=0.1)
            sim.note(f"lossy network for {duration_ms} ms")
            sim.schedule(sim.now_ns + duration_ms * MS, self._calm_network)
        elif kind == "disk-full":
            full = self._disk_full(duration_ms)
            line.update(target=full or "", fault="disk-full" if full else "none")
        elif kind == "clock":
            self._clock_jump(sim.hosts[target])
        elif kind == "slow-disk":
            self._slow_disk(sim.hosts[target], duration_ms)
        elif kind == "flush-crash":
            self._arm_flush_crash(sim.hosts[target])
        self.schedule_next()

    def _partition(self, target: str, duration_ms: int) -> None:
        sim = self.sim
        names = sorted(sim.hosts)
        choice = self.rng.random()
        if choice < 0.4:
            sim.network.isolate(target, names)
            sim.note(f"isolate {target} for {duration_ms} ms")
        elif choice < 0.7:
            sim.network.isolate(target, names, direction=self.rng.choice(("in", "out")))
            sim.note(f"one-way cut of {target} for {duration_ms} ms")
        else:
            nodes = list(range(1, sim.config.nodes + 1))
            side = set(self.rng.sample(nodes, self.rng.randint(1, len(nodes) - 1)))
            control = self.rng.random() < 0.5
            side_a = [n for n, h in sim.hosts.items() if h.node in side or (h.node == 0 and control and h.server)]
            side_b = [n for n, h in sim.hosts.items() if h.server and n not in side_a]
            sim.network.split(side_a, side_b)
            sim.note(f"split {sorted(side_a)} | {sorted(side_b)} for {duration_ms} ms")
        sim.schedule(sim.now_ns + duration_ms * MS, sim.network.heal)

    def _clock_jump(self, host: "Host") -> None:
        skew_ms = self.sim.config.clock_skew_max_ms
        host.clock_offset_ns = self.rng.randint(-skew_ms, skew_ms) * MS
        self.sim.note(f"the clock of {host.name} jumps to {host.clock_offset_ns / MS:+.0f} ms")
        if host.alive:
            self.sim.requeue_timers(host)

    def _slow_disk(self, host: "Host", duration_ms: int) -> None:
        host.disk_latency_ns = self.rng.randint(*SLOW_DISK_LATENCY_MS) * MS
        self.sim.note(f"the disk of {host.name} takes {host.disk_latency_ns / MS:.0f} ms a flush for {duration_ms} ms")

        def recover() -> None:
            host.disk_latency_ns = 0
        self.sim.schedule(self.sim.now_ns + duration_ms * MS, recover)

    def _disk_full(self, duration_ms: int) -> str | None:
        """Fill the disk of a running process that keeps data (a partition leader's half the time)
        for `duration_ms`; its name."""
        keepers = sorted((host for host in self.sim.hosts.values() if host.alive and host.kind in DATA_KINDS),
                         key=lambda host: host.name)
        leaders = [host for host in keepers if host.kind == "replica" and host.actor.leader is not None]
        if not keepers:
            return None
        host = self.rng.choice(leaders if leaders and self.rng.random() < 0.5 else keepers)
        faults = host.faults
        faults.disk_full = True
        self.sim.note(f"the disk of {host.name} is full for {duration_ms} ms")

        def free() -> None:  # the same disk only: a zombie fault may have given the host a new one
            faults.disk_full = False
        self.sim.schedule(self.sim.now_ns + duration_ms * MS, free)
        return host.name

    def _arm_flush_crash(self, host: "Host") -> None:
        if not host.alive:
            return
        fsyncs = self.rng.randint(0, 2)
        host.faults.crash_after_fsyncs = fsyncs
        if host.kind == "replica":
            self.lost_data_ns[host.state["topic_partition"]] = self.sim.now_ns  # it may, any moment now
        self.sim.note(f"{host.name} will die in its next flush, after {fsyncs} more fsyncs")
        incarnation = host.incarnation

        def disarm() -> None:  # no flush came: the fault passes
            if host.incarnation == incarnation:
                host.faults.crash_after_fsyncs = -1
        self.sim.schedule(self.sim.now_ns + 2000 * MS, disarm)

    def _calm_network(self) -> None:
        self.sim.network.faults = self.sim.config.network

    def heal(self) -> None:
        sim = self.sim
        self.active = False
        sim.network.heal()
        self._calm_network()
        for host in sim.hosts.values():
            host.paused_until_ns = min(host.paused_until_ns, sim.now_ns)
            host.disk_latency_ns = 0
            host.faults.crash_after_fsyncs = -1
            host.faults.disk_full = False
        sim.history.append({"type": "heal", "time_ns": sim.now_ns})
        sim.note("heal")
