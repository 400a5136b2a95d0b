"""The nemesis of the Raft simulation (chaos/sim_raft.py): what goes wrong, and when.

Every `fault_interval_ms` one of the configured faults strikes:

- `crash`: a voter dies at once (one whose flush is still pending 40% of the time, else the
  leader half of the rest) and restarts after `restart_delay_ms` from what its disk kept;
- `partition`: one voter is cut off (the leader half the time; both ways, or only what it sends,
  or only what it receives), or the voters split into a minority and a majority; each cut heals
  on its own after `heal_after_ms`, so cuts overlap and heal one by one;
- `network`: message loss, duplication and delay are scaled (0x, 1x, 5x or 20x) for a while;
- `disk`: a voter's disk stalls: its pending and next flushes wait 20-200 ms;
- `wipe` (only when configured): a voter crashes and restarts with an empty disk; half the time
  it is the leader, struck within 1 ms of its commit index moving, so its followers may not yet
  know how far it committed. Never while
  another voter is still rejoining (a majority of lost logs cannot be recovered from: the quorum
  would wait, by design).

And elections are struck on purpose (`election_strike_probability`): within 3 ms of becoming
leader a voter may crash or be cut off (before its first appends leave), and within 3 ms of a
candidate appearing another voter may crash (right after it may have voted). These windows are a
few milliseconds wide and hold most of what Raft's rules are for.
"""

from __future__ import annotations

from actors.raft.roles import Role
from chaos.sim_network import MS
from storage.memory import MemoryFileSystem


class FaultRules:
    """Mixed into RaftSimulation."""

    def _on_role(self, details: dict) -> None:
        """Note elections, and now and then strike during one (crash or cut off the new leader
        before its first appends leave, or a voter right after it may have voted): the windows
        where Raft's rules matter most are a few milliseconds wide."""
        node, role = details["node"], details["role"]
        if role == Role.LEADER.value:
            self.elections += 1
            self._note(f"controller-{node} leads term {details['term']}")
        if not self.faulty or self.rng.random() >= self.config.election_strike_probability:
            return
        at_ns = self.queue.now_ns + int(self.rng.uniform(0.0, 3.0) * MS)
        if role == Role.LEADER.value:
            self.queue.push(at_ns, self.rng.choice(self.config.leader_strikes), node)
        elif role == Role.CANDIDATE.value:
            others = [other for other in self.voters if other != node]
            self.queue.push(at_ns, "crash-now", self.rng.choice(others))

    def _fault(self) -> None:
        c = self.config
        self.queue.push(self.queue.now_ns + self.rng.randint(*c.fault_interval_ms) * MS, "fault", None)
        kind = self.rng.choice(c.faults)
        nodes = list(self.voters)
        leader = self._leader()
        if kind == "crash":
            pending = [node for node in nodes if self.voters[node].held]
            roll = self.rng.random()
            if pending and roll < 0.4:
                node = self.rng.choice(pending)
            elif leader and roll < 0.7:
                node = leader
            else:
                node = self.rng.choice(nodes)
            self.crash(node)
            self.queue.push(self.queue.now_ns + self.rng.randint(*c.restart_delay_ms) * MS, "restart", node)
        elif kind == "partition":
            self._partition(nodes, leader)
        elif kind == "network":
            self.network_scale = self.rng.choice((0.0, 1.0, 5.0, 20.0))
            self._note(f"network faults x{self.network_scale}")
            self.queue.push(self.queue.now_ns + self.rng.randint(*c.heal_after_ms) * MS, "heal", ())
        elif kind == "wipe":
            self._wipe(nodes, leader)
        elif kind == "disk":
            node = self.rng.choice(nodes)
            self._note(f"controller-{node}'s disk stalls")
            self.voters[node].flush_due = True  # its next flushes wait for this slow one
            self.queue.push(self.queue.now_ns + int(self.rng.uniform(20, 200) * MS), "flush",
                            (node, self.voters[node].incarnation))

    def _wipe(self, nodes: list[int], leader: int) -> None:
        if leader and self.rng.random() < 0.5:
            self.wipe_at_commit = leader  # struck when its commit index next moves (chaos/sim_raft.py _check)
        else:
            self._wipe_now(self.rng.choice(nodes))

    def _wipe_now(self, node: int) -> None:
        # One lost log at a time, judged by memory and disk alike: a voter caught up in memory but
        # whose disk still holds the mark would come back rejoining if it crashed now.
        if self.voters[node].raft is None or any(
                voter.wiped or voter.durable_rejoining or (voter.raft is not None and voter.raft.rejoining)
                for voter in self.voters.values()):
            return
        voter = self.voters[node]
        self.crash(node)
        self._note(f"controller-{node}'s disk is lost")
        voter.fs = MemoryFileSystem()
        voter.wiped = True
        # Its promises went with the disk: the rejoining mark must make that harmless.
        voter.promised_vote, voter.promised_match, voter.durable_up = (0, 0), 0, (0, 0)
        self.wipes += 1
        restart_ns = self.queue.now_ns + self.rng.randint(*self.config.restart_delay_ms) * MS
        self.queue.push(restart_ns, "restart", node)

    def _partition(self, nodes: list[int], leader: int) -> None:
        if self.rng.random() < 0.6:
            node = leader if leader and self.rng.random() < 0.5 else self.rng.choice(nodes)
            direction = self.rng.choice(("both", "both", "out", "in"))
            self._cut(self._isolation(node, direction), f"controller-{node} isolated ({direction})")
            return
        shuffled = self.rng.sample(nodes, len(nodes))
        minority, majority = shuffled[: (len(nodes) - 1) // 2], shuffled[(len(nodes) - 1) // 2:]
        links = [link for a in minority for b in majority for link in ((a, b), (b, a))]
        self._cut(links, f"split: {sorted(minority)} | {sorted(majority)}")

    def _isolation(self, node: int, direction: str) -> list[tuple[int, int]]:
        links = []
        for other in self.voters:
            if other != node:
                if direction in ("both", "out"):
                    links.append((node, other))
                if direction in ("both", "in"):
                    links.append((other, node))
        return links

    def _cut(self, links: list[tuple[int, int]], text: str) -> None:
        """Block `links` until a heal of these same links, later: partitions overlap and heal
        one by one (a link is open again only when every cut of it has healed)."""
        for link in links:
            self.blocked[link] = self.blocked.get(link, 0) + 1
        self._note(text)
        self.queue.push(self.queue.now_ns + self.rng.randint(*self.config.heal_after_ms) * MS, "heal", tuple(links))

    def _heal_links(self, links: tuple) -> None:
        if not links:
            self.network_scale = 1.0
        for link in links:
            count = self.blocked.get(link, 0) - 1
            if count > 0:
                self.blocked[link] = count
            else:
                self.blocked.pop(link, None)
