"""The host nemesis (chaos/host_nemesis.py) against a stand-in for the namespaces: each action
does the host fault, logs start and stop, undoes it after its duration, and `heal` undoes what
an aborted step left behind."""

from __future__ import annotations

import json
import threading
from typing import Callable

from chaos.host_nemesis import HostNemesis
from chaos.nemesis import FaultLog
from chaos.scenarios import FaultStep
from chaos.workload import LineRecorder


class Machines:
    """What NamespaceHosts offers the nemesis, recording every call."""

    def __init__(self) -> None:
        self.nodes = self.hosts = (1, 2, 3)
        self.calls: list[tuple] = []
        self.cut_off: set[int] = set()
        self.cut_pairs: set[tuple[int, int]] = set()
        self.degraded: set[int] = set()
        self.processes = {node: object() for node in self.nodes}

    def address(self, node: int) -> str:
        return f"10.0.0.{node}"

    def cut(self, node: int) -> None:
        self.calls.append(("cut", node))
        self.cut_off.add(node)

    def reconnect(self, node: int) -> None:
        self.calls.append(("reconnect", node))
        self.cut_off.discard(node)

    def cut_between(self, first: int, second: int, *, one_way: bool = False) -> None:
        self.calls.append(("cut_between", first, second, one_way))
        self.cut_pairs |= {(first, second)} if one_way else {(first, second), (second, first)}

    def mend_between(self, first: int, second: int) -> None:
        self.calls.append(("mend_between", first, second))
        self.cut_pairs -= {(first, second), (second, first)}

    def degrade(self, node: int, delay_ms: int, loss_percent: float) -> str:
        self.calls.append(("degrade", node, delay_ms, loss_percent))
        self.degraded.add(node)
        return f"netem: {delay_ms} ms delay, {loss_percent}% loss"

    def restore(self, node: int) -> None:
        self.calls.append(("restore", node))
        self.degraded.discard(node)

    def kill_node(self, node: int) -> int:
        self.calls.append(("kill", node))
        return 100 + node if self.processes.pop(node, None) is not None else 0

    def start_node(self, node: int):
        self.calls.append(("start", node))
        self.processes[node] = process = type("Started", (), {"pid": 200 + node})()
        return process


def nemesis(tmp_path) -> tuple[HostNemesis, Machines, Callable[[], list[dict]]]:
    machines = Machines()
    history, detail = LineRecorder(str(tmp_path / "h.jsonl"), 0), LineRecorder(str(tmp_path / "f.jsonl"), 0)
    made = HostNemesis(machines, FaultLog(history, detail, "t"))

    def lines() -> list[dict]:
        history.close()
        detail.close()
        return [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    return made, machines, lines


def test_a_cut_host_is_reconnected_after_its_duration_and_both_ends_are_logged(tmp_path):
    made, machines, lines = nemesis(tmp_path)
    made.perform(FaultStep(at_s=0, action="isolate", role="node", node=2, duration_s=0.01), 0)
    assert machines.calls == [("cut", 2), ("reconnect", 2)] and not machines.cut_off
    logged = [(line["nemesis"], line["target"], line["phase"]) for line in lines()]
    assert logged == [("isolate", "host-2", "start"), ("isolate", "host-2", "stop")]


def test_a_killed_host_is_started_again_and_a_lossy_link_restored(tmp_path):
    made, machines, lines = nemesis(tmp_path)
    made.perform(FaultStep(at_s=0, action="kill", role="node", node=1, duration_s=0.01), 0)
    made.perform(FaultStep(at_s=1, action="slow-link", role="node", node=3, duration_s=0.01, delay_ms=30,
                           drop_probability=0.05), 1)
    assert machines.calls == [("kill", 1), ("start", 1), ("degrade", 3, 30, 5.0), ("restore", 3)]
    recorded = lines()
    assert [line.get("pid") for line in recorded[:2]] == [101, 201]
    assert recorded[2]["applied"] == "netem: 30 ms delay, 5.0% loss"


def test_a_split_cuts_the_host_from_its_side_only_and_mends_it_after_its_duration(tmp_path):
    made, machines, lines = nemesis(tmp_path)
    made.perform(FaultStep(at_s=0, action="split", role="node", node=1, side=[3], one_way=True, duration_s=0.01), 0)
    made.perform(FaultStep(at_s=1, action="split", role="node", node=2, side=[1, 3], duration_s=0.01), 1)
    assert machines.calls == [("cut_between", 1, 3, True), ("mend_between", 1, 3),
                              ("cut_between", 2, 1, False), ("cut_between", 2, 3, False),
                              ("mend_between", 2, 1), ("mend_between", 2, 3)]
    assert not machines.cut_pairs
    recorded = lines()
    assert [(line["nemesis"], line["phase"], line.get("side"), line.get("one_way")) for line in recorded] == [
        ("split", "start", [3], True), ("split", "stop", None, None),
        ("split", "start", [1, 3], False), ("split", "stop", None, None)]


def test_a_split_naming_no_other_host_is_skipped(tmp_path):
    made, machines, lines = nemesis(tmp_path)
    made.perform(FaultStep(at_s=0, action="split", role="node", node=2, side=[2, 9], duration_s=1), 0)
    assert machines.calls == [] and [line["type"] for line in lines()] == ["note"]


def test_a_step_that_is_not_a_host_fault_is_skipped_with_a_note(tmp_path):
    made, machines, lines = nemesis(tmp_path)
    made.perform(FaultStep(at_s=0, action="kill", role="leader", partition=0), 0)
    made.perform(FaultStep(at_s=0, action="isolate", role="node", node=7, duration_s=1), 1)
    assert machines.calls == []
    assert [line["type"] for line in lines()] == ["note", "note"]


def test_heal_undoes_what_an_aborted_run_left_and_restarts_a_host_still_down(tmp_path):
    made, machines, lines = nemesis(tmp_path)
    machines.cut(1)
    machines.degrade(2, 30, 5.0)
    machines.kill_node(3)
    machines.cut_between(2, 3, one_way=True)
    machines.calls.clear()
    made.heal()
    assert sorted(machines.calls) == [("mend_between", 2, 3), ("reconnect", 1), ("restore", 2), ("start", 3)]
    assert not machines.cut_pairs
    healed = lines()[-1]
    assert healed["type"] == "heal" and "host 3 was still down" in healed["problems"][0]


def test_an_abort_ends_a_long_fault_early(tmp_path):
    made, machines, _ = nemesis(tmp_path)
    timer = threading.Timer(0.05, made.abort.set)
    timer.start()
    made.perform(FaultStep(at_s=0, action="isolate", role="node", node=1, duration_s=60), 0)
    timer.join()
    assert machines.calls == [("cut", 1), ("reconnect", 1)]
