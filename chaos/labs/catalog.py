"""Every lab, by number (the order of the issue that asked for them) and by name.

`COURSE` is the order docs/labs.md teaches them in: the order the articles ask their questions
(the question guide's six questions, with the interview guide's steps and edge cases beside).
"""

from __future__ import annotations

from chaos.labs import lab_backlog, lab_delivery, lab_groups, lab_queues, lab_replication
from chaos.labs.framework import Lab

LABS: list[Lab] = sorted(lab_delivery.LABS + lab_backlog.LABS + lab_queues.LABS + lab_groups.LABS
                         + lab_replication.LABS, key=lambda lab: lab.number)
BY_NAME: dict[str, Lab] = {lab.name: lab for lab in LABS}
COURSE = ["queue-is-not-faster", "crash-before-commit", "ack-before-processing", "visibility-timeout",
          "exactly-once-boundary", "hot-key", "poison-message", "idle-consumers", "backpressure",
          "queue-and-pubsub", "partition-count-change", "acks-and-failover", "unclean-election",
          "zombie-leader", "rebalance-pause"]


class UnknownLab(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"no lab named {self.name!r}; `railmq lab list` shows them all"


def find(name: str) -> Lab:
    """A lab by name or by number."""
    if name.isdigit():
        for lab in LABS:
            if lab.number == int(name):
                return lab
    lab = BY_NAME.get(name)
    if lab is None:
        raise UnknownLab(name)
    return lab
