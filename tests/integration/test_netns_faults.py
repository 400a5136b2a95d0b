"""The network faults of chaos/netns.py, measured with datagrams between the namespaces rather
than taken on trust: a cut between two hosts drops what passes between them (one way or both)
and nothing else, it holds together with a degraded link, and mending it leaves each link as it
was (no qdisc behind). No railmq node runs here: a small UDP listener in each namespace records
who reached it.

It needs root (namespaces, veths, a bridge) and skips with the reason where that is not allowed.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest

from chaos.netns import NamespaceHosts, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PROBE_PORT = 7499
LISTENER = """
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((sys.argv[1], int(sys.argv[2])))
with open(sys.argv[3], "a", buffering=1) as out:
    while True:
        data, _ = sock.recvfrom(256)
        out.write(data.decode() + "\\n")
"""
SENDER = """
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    sock.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
"""


class Probes:
    """A listener in every namespace; `reachable()` sends a datagram along every ordered pair of
    hosts and says which arrived."""

    def __init__(self, hosts: NamespaceHosts, directory: str) -> None:
        self.hosts = hosts
        self.directory = directory
        self.listeners: list[subprocess.Popen] = []
        self.round = 0
        for node in hosts.hosts:
            self.listeners.append(subprocess.Popen(
                ["ip", "netns", "exec", hosts.namespace(node), sys.executable, "-c", LISTENER,
                 hosts.address(node), str(PROBE_PORT), self._received_path(node)]))

    def _received_path(self, node: int) -> str:
        return os.path.join(self.directory, f"received-{node}.txt")

    def _received(self, node: int) -> set[str]:
        try:
            with open(self._received_path(node), encoding="utf-8") as lines:
                return {line.strip() for line in lines}
        except FileNotFoundError:
            return set()

    def reachable(self) -> set[tuple[int, int]]:
        self.round += 1
        pairs = list(itertools.permutations(self.hosts.hosts, 2))
        for source, destination in pairs:
            self.hosts.run_in(source, sys.executable, "-c", SENDER, self.hosts.address(destination), str(PROBE_PORT),
                              f"{self.round}:{source}")
        time.sleep(0.4)  # a datagram that passes arrives well within this on a bridge
        return {(source, destination) for source, destination in pairs
                if f"{self.round}:{source}" in self._received(destination)}

    def close(self) -> None:
        for listener in self.listeners:
            listener.kill()
            listener.wait(10)


@pytest.fixture
def probes(tmp_path):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    hosts = NamespaceHosts(str(tmp_path))
    made = None
    try:
        hosts.create()
        made = Probes(hosts, str(tmp_path))
        deadline = time.monotonic() + 10
        while len(made.reachable()) < 6:  # the listeners are up and every link passes
            assert time.monotonic() < deadline, "the hosts never reached each other"
        yield made
    finally:
        if made is not None:
            made.close()
        hosts.destroy()


def qdisc_of(hosts: NamespaceHosts, node: int) -> str:
    return hosts.run_in(node, "tc", "qdisc", "show", "dev", "eth0").stdout


EVERY_PAIR = set(itertools.permutations((1, 2, 3), 2))


def test_a_cut_between_two_hosts_drops_only_what_passes_between_them(probes):
    hosts = probes.hosts
    hosts.cut_between(1, 2)
    assert probes.reachable() == EVERY_PAIR - {(1, 2), (2, 1)}
    hosts.mend_between(1, 2)
    assert probes.reachable() == EVERY_PAIR
    assert "htb" not in qdisc_of(hosts, 1) and "htb" not in qdisc_of(hosts, 2)


def test_a_one_way_cut_drops_one_direction_and_both_cuts_of_a_host_hold_together(probes):
    hosts = probes.hosts
    hosts.cut_between(3, 1, one_way=True)
    assert probes.reachable() == EVERY_PAIR - {(3, 1)}
    hosts.cut_between(3, 2, one_way=True)  # host 3 now only hears the others
    assert probes.reachable() == EVERY_PAIR - {(3, 1), (3, 2)}
    hosts.mend_between(1, 3)
    assert probes.reachable() == EVERY_PAIR - {(3, 2)}
    hosts.mend_between(2, 3)
    assert probes.reachable() == EVERY_PAIR and "htb" not in qdisc_of(hosts, 3)


def test_a_degraded_link_and_a_cut_on_the_same_host_hold_at_once_and_undo_separately(probes):
    hosts = probes.hosts
    applied = hosts.degrade(2)
    hosts.cut_between(2, 3)
    assert probes.reachable() == EVERY_PAIR - {(2, 3), (3, 2)}, applied
    if applied.startswith("netem"):
        assert "netem" in qdisc_of(hosts, 2)
    else:  # no netem in this kernel: the passing class is held to 2 mbit/s
        classes = hosts.run_in(2, "tc", "class", "show", "dev", "eth0").stdout
        assert "class htb 1:1" in classes and "rate 2Mbit" in classes, classes
    hosts.restore(2)  # the cut stays
    assert probes.reachable() == EVERY_PAIR - {(2, 3), (3, 2)}
    hosts.mend_between(2, 3)
    assert probes.reachable() == EVERY_PAIR
    assert "htb" not in qdisc_of(hosts, 2) and "netem" not in qdisc_of(hosts, 2)
