"""The nemesis of a cluster across hosts (chaos/netns.py): a machine's faults, not a process's.

Steps name a host (`role` "node", `node` n) and one of four actions, each undone by `perform`
itself after the step's duration (or early when `abort` is set):

- `isolate`: the host's link goes down — a partition between it and every other host and
  every client; its processes keep running, cut off, and must not acknowledge what the others
  do not hold;
- `split`: what passes between the host and the hosts of `side` is dropped (one way, from the
  host to them, when `one_way`), while each still reaches every other host and the clients — a
  partial partition, which a quorum and an ISR must ride out without a second leader;
- `slow-link`: delay and loss on the host's link (`tc netem`, or a slow link on a kernel
  without netem: the fault line says which);
- `kill`: every process of the host killed at once (the node process, its voters, its
  replicas), then `railmq node` started again on the same data directory — a machine that
  crashed and rebooted.

Fault lines name the host (`target` "host-<n>", role "node") in the history and in
`faults.jsonl`, like the process nemesis (chaos/nemesis.py). `heal` reconnects, restores and
restarts whatever is still down, and writes the `heal` line.
"""

from __future__ import annotations

import threading

from chaos.nemesis import FaultLog, StepSkipped, Victim
from chaos.netns import NamespaceHosts
from chaos.scenarios import FaultStep

HOST_ACTIONS = ("isolate", "split", "slow-link", "kill")


class HostNemesis:
    def __init__(self, hosts: NamespaceHosts, log: FaultLog) -> None:
        self.hosts = hosts
        self.log = log
        self.abort = threading.Event()

    def close(self) -> None:
        pass

    def perform(self, step: FaultStep, index: int = 0) -> None:
        """Do one step; a step with a duration is undone before this returns."""
        try:
            if step.role != "node" or step.action not in HOST_ACTIONS or step.node not in self.hosts.nodes:
                raise StepSkipped(f"{step.action} of {step.role} {step.node} is not a host fault")
            victim = Victim(f"host-{step.node}", "node", "host", None, step.node)
            getattr(self, "_do_" + step.action.replace("-", "_"))(step, index, victim)
        except StepSkipped as skipped:
            self.log.note(index, step.action, f"skipped: {skipped}")

    def _do_isolate(self, step: FaultStep, index: int, victim: Victim) -> None:
        self.hosts.cut(victim.node)
        self.log.fault("isolate", victim, "start", index, address=self.hosts.address(victim.node))
        self.abort.wait(step.duration_s)
        self.hosts.reconnect(victim.node)
        self.log.fault("isolate", victim, "stop", index)

    def _do_split(self, step: FaultStep, index: int, victim: Victim) -> None:
        others = [node for node in step.side if node in self.hosts.hosts and node != victim.node]
        if not others:
            raise StepSkipped(f"a split of host {victim.node} names no other host: {step.side}")
        for other in others:
            self.hosts.cut_between(victim.node, other, one_way=step.one_way)
        self.log.fault("split", victim, "start", index, side=others, one_way=step.one_way)
        self.abort.wait(step.duration_s)
        for other in others:
            self.hosts.mend_between(victim.node, other)
        self.log.fault("split", victim, "stop", index)

    def _do_slow_link(self, step: FaultStep, index: int, victim: Victim) -> None:
        applied = self.hosts.degrade(victim.node, step.delay_ms or 30, round(step.drop_probability * 100, 1))
        self.log.fault("slow-link", victim, "start", index, applied=applied)
        self.abort.wait(step.duration_s)
        self.hosts.restore(victim.node)
        self.log.fault("slow-link", victim, "stop", index)

    def _do_kill(self, step: FaultStep, index: int, victim: Victim) -> None:
        pid = self.hosts.kill_node(victim.node)
        if not pid:
            raise StepSkipped(f"host {victim.node} was not running")
        self.log.fault("kill", victim, "start", index, pid=pid)
        self.abort.wait(step.duration_s)
        started = self.hosts.start_node(victim.node)
        self.log.fault("kill", victim, "stop", index, pid=started.pid)

    def heal(self) -> int:
        """Undo every host fault still in force and write the `heal` line; returns its stamp."""
        self.abort.set()
        problems: list[str] = []
        for node in sorted(self.hosts.cut_off):
            self.hosts.reconnect(node)
        for first, second in sorted(self.hosts.cut_pairs):
            self.hosts.mend_between(first, second)
        for node in sorted(self.hosts.degraded):
            self.hosts.restore(node)
        for node in self.hosts.nodes:
            if node not in self.hosts.processes:
                self.hosts.start_node(node)
                problems.append(f"host {node} was still down at the heal: started again")
        return self.log.heal(problems)
