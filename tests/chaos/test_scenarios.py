"""Named chaos scenarios, the workload that runs under them, and the smoke tier on real processes.

Unit stories first (no process): schedules are seeded, replayable and well formed; producers
record exactly one completion per send and classify outcomes as the history format demands;
members record polls, commits and assignments; a killed worker's open operations become `info`.

Then the smoke tier (`integration`): every safe scenario runs for SMOKE_DURATION_S on a real
cluster and must show no safety violation and at least 2,000 acknowledged writes; each teaching
scenario must lose acknowledged writes (retrying the next seed a bounded number of times) and
name them in its report. Longer soaks are `slow`.

Budget: the smoke tier is the bulk of the chaos tests' time on a 2-core machine, so the safe
scenarios run for 15 s of faults each, not 20 (about 22 s per run with start-up, recovery and
checking); 20 s runs and long soaks are in the `slow` tier.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest

from actors.errors import ErrorCode, RailmqError
from chaos import workload
from chaos.runner import CHAOS_LIMITS
from chaos.scenarios import (
    SCENARIOS, SCHEDULE_TAIL_S, FaultStep, ScheduleError, UnknownScenario, check_schedule, get_scenario,
    safe_scenarios, teaching_scenarios,
)
from chaos.workers import Incarnation, TornHistory, close_open_operations, merge_histories, read_worker_lines
from chaos.workload import (
    LineRecorder, MemberLoop, MemberSpec, ProducerLoop, ProducerSpec, classify_send_error,
)

SMOKE_DURATION_S = 15.0
TEACHING_DURATION_S = 12.0
TEACHING_SEEDS_TRIED_MAX = 3
ACKNOWLEDGED_MIN = 2000


# --------------------------------------------------------------------------- scenarios as data


def test_the_registry_has_every_scenario_the_issue_names():
    assert set(SCENARIOS) == {
        "leader-kill", "follower-kill", "coordinator-kill", "consumer-crash-before-commit",
        "zombie-leader-pause", "isolate-leader", "rolling-restart", "disk-loss", "mixed", "acks1-leader-kill",
        "unclean-election", "controller-kill", "controller-isolate", "group-coordinator-kill", "node-loss",
        "multi-host"}
    assert {scenario.name for scenario in teaching_scenarios()} == {"acks1-leader-kill", "unclean-election"}
    assert all(not scenario.expect_loss for scenario in safe_scenarios())


def test_safe_scenarios_keep_the_promise_preconditions():
    for scenario in safe_scenarios():
        shape = scenario.shape
        assert (shape.replication_factor, shape.min_insync_replicas, shape.acks) == (3, 2, -1), scenario.name
        assert shape.idempotent and not shape.unclean_leader_election, scenario.name


def test_teaching_scenarios_break_a_precondition_on_purpose():
    assert get_scenario("acks1-leader-kill").shape.acks == 1
    unclean = get_scenario("unclean-election").shape
    assert unclean.unclean_leader_election and unclean.min_insync_replicas == 1


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_seed_replays_the_same_schedule(name):
    scenario = get_scenario(name)
    first = scenario.schedule(random.Random(11), 20.0)
    assert first == scenario.schedule(random.Random(11), 20.0)
    assert first, f"{name} performs at least one fault in 20 s"
    check_schedule(first, 20.0)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_smoke_length_run_sees_several_faults(name):
    steps = get_scenario(name).schedule(random.Random(3), SMOKE_DURATION_S)
    starts = [step for step in steps if step.action != "resume"]
    assert len(starts) >= 2, f"{name}: {steps}"
    assert all(step.end_s <= SMOKE_DURATION_S - SCHEDULE_TAIL_S for step in steps)


def test_different_seeds_give_different_mixed_schedules():
    scenario = get_scenario("mixed")
    schedules = {json.dumps([step.action for step in scenario.schedule(random.Random(seed), 60.0)])
                 for seed in range(5)}
    assert len(schedules) > 1
    actions = {step.action for seed in range(20) for step in scenario.schedule(random.Random(seed), 60.0)}
    assert {"kill", "pause", "isolate", "split", "cut", "slow-link", "disk-full", "crash-member",
            "restart"} <= actions


def test_teaching_episodes_resume_what_they_paused():
    for name in ("acks1-leader-kill", "unclean-election"):
        steps = get_scenario(name).schedule(random.Random(5), 30.0)
        paused = [step.label for step in steps if step.action == "pause" and step.label]
        resumed = [step.label for step in steps if step.action == "resume"]
        assert paused and sorted(paused) == sorted(resumed), name


def test_the_unclean_episode_lets_the_follower_leave_the_isr_before_the_leader_stops():
    steps = get_scenario("unclean-election").schedule(random.Random(1), 30.0)[:4]
    assert [(step.action, step.role) for step in steps] == [
        ("pause", "followers"), ("pause", "leader"), ("resume", "label"), ("resume", "label")]
    assert steps[1].at_s - steps[0].at_s > 3.0, "past the 2 s lag time, so the ISR shrinks to the leader"


@pytest.mark.parametrize("steps, problem", [
    ([FaultStep(at_s=3, action="kill", role="leader"), FaultStep(at_s=2, action="kill", role="leader")],
     "order"),
    ([FaultStep(at_s=1, action="explode", role="leader")], "unknown"),
    ([FaultStep(at_s=8, action="pause", role="leader", duration_s=2.5)], "ends after"),
    ([FaultStep(at_s=1, action="pause", role="followers", label="f")], "never resumed"),
])
def test_check_schedule_refuses_malformed_schedules(steps, problem):
    with pytest.raises(ScheduleError, match=problem):
        check_schedule(steps, 10.0)


def test_an_unknown_scenario_names_the_known_ones():
    with pytest.raises(UnknownScenario, match="leader-kill"):
        get_scenario("leader-kil")


# --------------------------------------------------------------------------- workload: producers


class FakeFuture:
    def __init__(self) -> None:
        self.callbacks = []
        self.error: BaseException | None = None
        self.metadata = None
        self.done = False

    def add_done_callback(self, callback) -> None:
        if self.done:
            callback(self)
        else:
            self.callbacks.append(callback)

    def complete(self, metadata=None, error=None) -> None:
        self.metadata, self.error, self.done = metadata, error, True
        for callback in self.callbacks:
            callback(self)

    def exception(self, timeout=None):
        return self.error

    def result(self, timeout=None):
        return self.metadata


class FakeProducer:
    """Answers each send through `answer(key, value, future)`, from the calling thread."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.sent: list[tuple[str, str]] = []

    def send(self, topic, value, key=None):
        future = FakeFuture()
        self.sent.append((key, value))
        self.answer(key, value, future)
        return future


class Metadata:
    def __init__(self, partition: int, offset: int) -> None:
        self.partition, self.offset = partition, offset


def producer_spec(tmp_path: Path, keys=("k0", "k1"), rate_per_s=2000) -> ProducerSpec:
    return ProducerSpec(process="producer-1", client_id="chaos-producer-1", bootstrap="tcp://127.0.0.1:1",
                        topic="t", history_path=str(tmp_path / "p.jsonl"), origin_ns=0, keys=list(keys),
                        rate_per_s=rate_per_s, seed=3)


def run_producer(spec: ProducerSpec, producer, sends_max: int) -> list[dict]:
    stop = threading.Event()
    original = producer.answer

    def answer(key, value, future):
        original(key, value, future)
        if len(producer.sent) >= sends_max:
            stop.set()

    producer.answer = answer
    recorder = LineRecorder(spec.history_path, spec.origin_ns)
    ProducerLoop(spec, recorder, stop, producer).run()
    recorder.close()
    return [json.loads(line) for line in Path(spec.history_path).read_text().splitlines()]


def test_each_send_has_one_invoke_then_one_completion(tmp_path):
    offsets = iter(range(1000))
    producer = FakeProducer(lambda key, value, future: future.complete(Metadata(0, next(offsets))))
    lines = run_producer(producer_spec(tmp_path), producer, sends_max=40)
    invokes = [line["value"] for line in lines if line["type"] == "invoke"]
    oks = [line for line in lines if line["type"] == "ok"]
    assert len(invokes) == 40 == len(set(invokes)) == len(oks)
    assert [line["value"] for line in oks] == invokes, "each completion follows its own invoke"
    assert all(line["partition"] == 0 and "offset" in line for line in oks)
    assert [line["time_ns"] for line in lines] == sorted(line["time_ns"] for line in lines)
    assert all(line["value"].startswith("producer-1:k") for line in lines)


def test_a_key_has_one_send_in_flight_at_a_time(tmp_path):
    held: dict[str, FakeFuture] = {}
    overlaps = []

    def answer(key, value, future):
        if key in held:
            overlaps.append(key)
        held[key] = future
        if len(held) == 2:  # both keys in flight: release them in turn
            for waiting_key in list(held):
                held.pop(waiting_key).complete(Metadata(0, 1))

    lines = run_producer(producer_spec(tmp_path), FakeProducer(answer), sends_max=20)
    assert overlaps == []
    assert sum(line["type"] == "ok" for line in lines) >= 18


def test_a_send_without_an_outcome_is_written_off_as_indeterminate(tmp_path, monkeypatch):
    monkeypatch.setattr(workload, "DELIVERY_TIMEOUT_MS", 50)
    monkeypatch.setattr(workload, "SEND_OUTCOME_GRACE_MS", 50)
    never = FakeProducer(lambda key, value, future: None)
    lines = run_producer(producer_spec(tmp_path, keys=("k0",)), never, sends_max=1)
    assert [line["type"] for line in lines] == ["invoke", "info"]
    assert lines[1]["error"] == "no outcome before the producer stopped"


def test_a_late_callback_after_the_write_off_adds_no_second_completion(tmp_path, monkeypatch):
    monkeypatch.setattr(workload, "DELIVERY_TIMEOUT_MS", 20)
    monkeypatch.setattr(workload, "SEND_OUTCOME_GRACE_MS", 20)
    futures: list[FakeFuture] = []
    lines = run_producer(producer_spec(tmp_path, keys=("k0",)),
                         FakeProducer(lambda key, value, future: futures.append(future)), sends_max=1)
    futures[0].complete(Metadata(0, 5))
    lines = [json.loads(line) for line in Path(tmp_path / "p.jsonl").read_text().splitlines()]
    assert [line["type"] for line in lines] == ["invoke", "info"]


@pytest.mark.parametrize("error, expected", [
    (RailmqError(ErrorCode.NOT_ENOUGH_REPLICAS, "the ISR is too small"), ("fail", "NOT_ENOUGH_REPLICAS")),
    (RailmqError(ErrorCode.NOT_ENOUGH_REPLICAS, "delivery timed out after 1 attempts; last error: x"),
     ("fail", "NOT_ENOUGH_REPLICAS")),
    (RailmqError(ErrorCode.NOT_ENOUGH_REPLICAS, "delivery timed out after 4 attempts; last error: x"),
     ("info", "NOT_ENOUGH_REPLICAS")),
    (RailmqError(ErrorCode.DISK_FULL, "no space"), ("fail", "DISK_FULL")),
    (RailmqError(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ""),
     ("info", "NOT_ENOUGH_REPLICAS_AFTER_APPEND")),
    (RailmqError(ErrorCode.REQUEST_TIMED_OUT, ""), ("info", "REQUEST_TIMED_OUT")),
    (RailmqError(ErrorCode.NOT_LEADER, "lost the connection; the batch may have been written"),
     ("info", "NOT_LEADER")),
    (TimeoutError("no acknowledgement"), ("info", "timeout")),
])
def test_only_a_definite_refusal_on_the_only_attempt_is_a_failure(error, expected):
    assert classify_send_error(error) == expected


def test_a_send_refused_before_it_left_the_producer_is_a_failure(tmp_path):
    class Refusing(FakeProducer):
        def send(self, topic, value, key=None):
            self.sent.append((key, value))
            self.answer(key, value, None)
            raise RailmqError(ErrorCode.BUSY, "buffer full")

    lines = run_producer(producer_spec(tmp_path, keys=("k0",)), Refusing(lambda *args: None), sends_max=1)
    assert [(line["type"], line.get("error")) for line in lines] == [("invoke", None), ("fail", "BUSY")]


# --------------------------------------------------------------------------- workload: members


class FakeRecord:
    def __init__(self, partition: int, offset: int, value: str) -> None:
        self.topic, self.partition, self.offset = "t", partition, offset
        self.key, self.value = b"k", value.encode()


class FakeConsumer:
    def __init__(self, batches: list[list[FakeRecord]], commit_errors: list, stop: threading.Event) -> None:
        self.batches, self.commit_errors, self.stop = batches, commit_errors, stop
        self.on_assign = None
        self.committed: list[dict] = []

    def subscribe(self, topics, on_assign=None):
        self.on_assign = on_assign

    def assignment(self):
        from railmq.records import TopicPartition
        return [TopicPartition("t", 0), TopicPartition("t", 2)]

    def member_id(self):
        return "m-1"

    def generation(self):
        return 4

    def poll(self, timeout_ms):
        if self.on_assign is not None:
            self.on_assign, callback = None, self.on_assign
            callback(self.assignment())
        if not self.batches:
            self.stop.set()
            return []
        return self.batches.pop(0)

    def commit(self, offsets):
        error = self.commit_errors.pop(0) if self.commit_errors else None
        if error is not None:
            raise error
        self.committed.append({tp.partition: offset for tp, offset in offsets.items()})


def test_a_member_records_assignment_polls_and_commit_outcomes(tmp_path):
    stop = threading.Event()
    batches = [[FakeRecord(0, 5, "a"), FakeRecord(2, 9, "b"), FakeRecord(0, 6, "c")], [FakeRecord(0, 7, "d")],
               [FakeRecord(2, 10, "e")]]
    errors = [None, RailmqError(ErrorCode.ILLEGAL_GENERATION, "fenced"),
              RailmqError(ErrorCode.REQUEST_TIMED_OUT, "")]
    consumer = FakeConsumer(batches, errors, stop)
    spec = MemberSpec(process="g1/member-1", client_id="chaos-member-1", bootstrap="tcp://127.0.0.1:1",
                      topic="t", group="g1", history_path=str(tmp_path / "m.jsonl"), origin_ns=0,
                      processing_ms=0)
    recorder = LineRecorder(spec.history_path, 0)
    MemberLoop(spec, recorder, stop, consumer).run()
    recorder.close()
    lines = [json.loads(line) for line in Path(spec.history_path).read_text().splitlines()]
    summary = [(line["type"], line["f"]) for line in lines]
    assert summary == [("ok", "assign"), ("ok", "poll"), ("invoke", "commit"), ("ok", "commit"),
                       ("ok", "poll"), ("invoke", "commit"), ("fail", "commit"),
                       ("ok", "poll"), ("invoke", "commit"), ("info", "commit")]
    assert lines[0]["partitions"] == [0, 2] and lines[0]["generation"] == 4 and lines[0]["member"] == "m-1"
    assert lines[1]["records"] == [[0, 5, "k", "a"], [2, 9, "k", "b"], [0, 6, "k", "c"]]
    assert lines[2]["offsets"] == {"0": 7, "2": 10}, "the offset after the last record of each partition"
    assert lines[6]["error"] == "ILLEGAL_GENERATION"
    assert consumer.committed == [{0: 7, 2: 10}]


# --------------------------------------------------------------------------- merging worker histories


def sent(kind: str, at_ns: int, value: str, process: str = "producer-1", **fields) -> dict:
    return {"type": kind, "f": "send", "time_ns": at_ns, "process": process, "topic": "t", "key": "k",
            "value": value, **fields}


def write_lines(path: Path, lines: list[dict], tail: bytes = b"") -> str:
    path.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines) + tail)
    return str(path)


def test_a_killed_worker_s_open_operations_become_info(tmp_path):
    lines = [
        sent("invoke", 10, "a"), sent("ok", 12, "a", partition=0, offset=0), sent("invoke", 13, "b"),
        {"type": "invoke", "f": "commit", "time_ns": 14, "process": "g/m", "group": "g", "topic": "t",
         "offsets": {"0": 1}},
    ]
    closing = close_open_operations(lines, ended_ns=20)
    assert [(line["type"], line["f"], line.get("value"), line["time_ns"]) for line in closing] == [
        ("info", "send", "b", 20), ("info", "commit", None, 20)]


def test_a_torn_last_line_is_tolerated_only_for_a_killed_worker(tmp_path):
    good = [sent("invoke", 1, "a")]
    path = write_lines(tmp_path / "w.jsonl", good, tail=b'{"type":"ok","f":"se')
    assert read_worker_lines(path, killed=True) == good
    with pytest.raises(TornHistory):
        read_worker_lines(path, killed=False)


def test_merged_histories_are_ordered_by_time_and_start_with_the_config(tmp_path):
    runner = [{"type": "config", "time_ns": 0, "scenario": "s"}, {"type": "heal", "time_ns": 25}]
    first = write_lines(tmp_path / "p1.jsonl", [
        sent("invoke", 10, "a", "p1"), sent("ok", 30, "a", "p1", partition=0, offset=0)])
    second = write_lines(tmp_path / "p2.jsonl", [
        sent("invoke", 20, "b", "p2")])
    incarnations = [Incarnation("p1", first, 1, 0, ended_ns=40), Incarnation("p2", second, 2, 0, ended_ns=22,
                                                                             killed=True)]
    out = tmp_path / "history.jsonl"
    assert merge_histories(runner, incarnations, str(out)) == 6
    merged = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(line["type"], line["time_ns"]) for line in merged] == [
        ("config", 0), ("invoke", 10), ("invoke", 20), ("info", 22), ("heal", 25), ("ok", 30)]


# --------------------------------------------------------------------------- the command line


def chaos_parser():
    import argparse

    from railmq import cli_chaos

    parser = argparse.ArgumentParser(prog="railmq")
    cli_chaos.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_railmq_chaos_parses_run_with_seed_duration_and_report():
    args = chaos_parser().parse_args(["chaos", "run", "leader-kill", "--seed", "3", "--duration", "5",
                                      "--report", "out"])
    assert (args.scenario, args.seed, args.duration, args.report) == ("leader-kill", 3, 5.0, "out")
    assert args.handler.__name__ == "run_run"


@pytest.mark.parametrize("bad", [["--duration", "0"], ["--duration", "soon"], ["--seed", "-1"]])
def test_railmq_chaos_run_refuses_bad_numbers(bad, capsys):
    with pytest.raises(SystemExit) as refused:
        chaos_parser().parse_args(["chaos", "run", "leader-kill", *bad])
    assert refused.value.code == 2


def test_railmq_chaos_list_names_every_scenario(capsys):
    args = chaos_parser().parse_args(["chaos", "list"])
    assert args.handler(args) == 0
    shown = capsys.readouterr().out
    assert all(name in shown for name in SCENARIOS) and "expected" in shown


def test_an_unknown_scenario_is_a_usage_error(capsys):
    args = chaos_parser().parse_args(["chaos", "run", "leader-kil"])
    assert args.handler(args) == 2
    assert "no scenario named 'leader-kil'" in capsys.readouterr().err


def test_a_multi_host_run_where_namespaces_cannot_be_made_is_refused_with_the_reason(capsys, monkeypatch):
    import chaos.__main__ as entry

    monkeypatch.setattr(entry, "hosts_unavailable", lambda: "network namespaces need root")
    args = chaos_parser().parse_args(["chaos", "run", "multi-host", "--duration", "5"])
    assert args.handler(args) == 2
    error = capsys.readouterr().err
    assert "multi-host" in error and "network namespaces need root" in error


def test_the_multi_host_schedule_partitions_kills_and_splits_two_hosts_even_in_a_short_run():
    one_way = set()
    for seed in range(1, 9):
        steps = get_scenario("multi-host").schedule(random.Random(seed), SMOKE_DURATION_S)
        assert [step.action for step in steps][:3] == ["isolate", "kill", "split"], steps
        assert all(step.role == "node" and 1 <= step.node <= 3 and step.duration_s > 0 for step in steps)
        cut, split = steps[0], steps[2]
        session_s = max(CHAOS_LIMITS.node_session_timeout_ms, CHAOS_LIMITS.replica_session_timeout_ms) / 1000
        assert cut.duration_s > session_s, "the host is cut off for longer than a session"
        assert split.duration_s > session_s and len(split.side) == 1 and split.side[0] != split.node
        assert 1 <= split.side[0] <= 3
        one_way.add(split.one_way)
    assert one_way == {True, False}, "both kinds of split are drawn"


def test_railmq_chaos_check_is_the_history_checker(tmp_path, capsys):
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps(sent("invoke", 1, "a")) + "\n")
    args = chaos_parser().parse_args(["chaos", "check", str(history), "--json"])
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out)["sends"] == 1


def test_the_default_report_folder_names_the_scenario_and_seed():
    from chaos.__main__ import default_report_dir

    assert default_report_dir("mixed", 4, now=0).startswith("chaos-reports/mixed-seed4-")


# --------------------------------------------------------------------------- the smoke tier


def run(name: str, seed: int, duration_s: float, tmp_path: Path):
    from chaos.netns import unavailable
    from chaos.runner import run_scenario

    if get_scenario(name).over_hosts and (reason := unavailable()):
        pytest.skip(f"{name} needs network namespaces: {reason}")
    return run_scenario(get_scenario(name), seed=seed, duration_s=duration_s,
                        report_dir=str(tmp_path / f"{name}-{seed}"))


def assert_clean_run(outcome) -> None:
    result = outcome.result
    assert result.valid, f"{result.scenario}: {result.violations}"
    assert result.acknowledged >= ACKNOWLEDGED_MIN, f"only {result.acknowledged} acknowledged"
    assert result.faults >= 1, "the nemesis did something"
    assert result.leftover_processes == [] and result.leftover_shm == []
    for name in ("history.jsonl", "faults.jsonl", "trace.jsonl", "summary.json", "report.html"):
        assert (Path(outcome.report_dir) / name).exists(), name


@pytest.mark.integration
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", [scenario.name for scenario in safe_scenarios()])
def test_a_safe_scenario_keeps_every_acknowledged_write(name, tmp_path):
    assert_clean_run(run(name, seed=1, duration_s=SMOKE_DURATION_S, tmp_path=tmp_path))


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", [scenario.name for scenario in teaching_scenarios()])
def test_a_teaching_scenario_loses_acknowledged_writes_and_names_them(name, tmp_path):
    for seed in range(1, TEACHING_SEEDS_TRIED_MAX + 1):
        outcome = run(name, seed=seed, duration_s=TEACHING_DURATION_S, tmp_path=tmp_path)
        if outcome.result.lost > 0:
            break
    else:
        pytest.fail(f"{name} lost nothing in {TEACHING_SEEDS_TRIED_MAX} seeds")
    result = outcome.result
    assert result.expect_loss and result.leftover_processes == []
    summary = json.loads((Path(outcome.report_dir) / "summary.json").read_text())
    named = summary["anomalies"]["lost_messages"]
    assert summary["lost"] == result.lost and named, "summary.json names the lost messages"
    page = (Path(outcome.report_dir) / "report.html").read_text()
    assert f"Lost messages ({result.lost})" in page and f"<td>{named[0]['value']}</td>" in page


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", [scenario.name for scenario in safe_scenarios()])
def test_a_safe_scenario_survives_a_longer_soak(name, tmp_path):
    assert_clean_run(run(name, seed=2, duration_s=60.0, tmp_path=tmp_path))
