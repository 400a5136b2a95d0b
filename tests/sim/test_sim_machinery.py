"""The simulator's own machinery, piece by piece: the flush model, a kill in the middle of a flush,
clock jumps, exit notices, and each promise check shown failing on the event that breaks it.

The sweeps in test_simulator.py show the checks pass on railmq and catch the broken variants;
these show, on hand-made events, that each check says exactly what it should."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from actors.effects import AfterFlush, SetTimer, Trace
from actors.messages import (
    AcquiredRecords, ShareAcknowledgement, ShareAcknowledgementResult, ShareAcknowledgeRequest,
    ShareAcknowledgeResponse, ShareAcquireRequest, ShareAcquireResponse, Stop, TimerFired,
)
from chaos.sim_checks import _check_send_order
from chaos.sim_hosts import Host, SimFaultInjector
from chaos.sim_invariants import Invariants
from chaos.sim_network import MS
from chaos import sim_disk
from chaos.sim_share import ShareLedger, is_poison
from chaos.sim_faults import STOP_WAIT_MAX_MS
from chaos.simulator import SimConfig, Simulator
from storage.errors import FsyncFailed
from storage.memory import MemoryFileSystem

pytestmark = pytest.mark.sim


class Store:
    def __init__(self) -> None:
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


class Probe:
    """An actor that asks for one guarded flush per message and sets a timer when told."""

    name = "probe"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.fired: list[int] = []

    def start(self, now_ns: int) -> list:
        return []

    def invariants(self) -> None:
        pass

    def handle(self, message, sender, now_ns: int) -> list:
        if isinstance(message, TimerFired):
            self.fired.append(now_ns)
            return []
        if message == "timer":
            return [SetTimer("wake", now_ns + 100 * MS)]
        if message == "write, then say so":  # a guarded effect, then an unguarded one in the same step
            return [AfterFlush(self.store, (Trace("flushed", {"message": "write"}),)),
                    Trace("flushed", {"message": "said"})]
        return [AfterFlush(self.store, (Trace("flushed", {"message": message}),))]


def probe_sim() -> tuple[Simulator, Host, Store, list]:
    sim = Simulator(1, SimConfig(faults=()))
    store = Store()
    host = Host("probe", "probe", 0, lambda host, incarnation: Probe(store), server=False)
    sim._add(host)
    sim._boot(host)
    traced: list = []
    sim._on_trace = lambda host, event, details: traced.append((sim.now_ns, details["message"]))
    return sim, host, store, traced


def test_a_flush_on_a_fast_disk_applies_what_it_guards_at_once():
    sim, host, store, traced = probe_sim()
    sim._step(host, "write", b"")
    assert store.flushes == 1 and traced == [(sim.now_ns, "write")]


def test_a_slow_disk_holds_back_what_the_flush_guards_and_keeps_the_process_busy():
    sim, host, store, traced = probe_sim()
    host.disk_latency_ns = 50 * MS
    start = sim.now_ns
    sim._step(host, "first", b"")
    sim._step(host, "second", b"")  # queued behind the first flush
    sim.run_until(start + 99 * MS)
    assert traced == [(start + 50 * MS, "first")]
    assert host.paused_until_ns == start + 100 * MS, "busy until its last flush completes"
    sim.run_until(start + 100 * MS)
    assert [message for _, message in traced] == ["first", "second"] and store.flushes == 2


def test_what_a_step_does_after_a_slow_flush_waits_for_it_as_in_the_runtime():
    """The runtime flushes inline: an effect after an AfterFlush in the same step happens after
    the flush. On a slow disk it must not overtake what the flush guards."""
    sim, host, store, traced = probe_sim()
    host.disk_latency_ns = 50 * MS
    start = sim.now_ns
    sim._step(host, "write, then say so", b"")
    sim.run_until(start + 49 * MS)
    assert traced == [], "the step's later effect went out while the process sat in fsync"
    sim.run_until(start + 50 * MS)
    assert traced == [(start + 50 * MS, "write"), (start + 50 * MS, "said")]


def test_a_flush_begun_as_the_previous_one_completes_stays_behind_it():
    """A slow flush completes at the very instant the disk becomes fast again and a new step
    flushes: the new step's guarded effects come after the old one's (flushes of one process are
    sequential), not before because the disk is fast now."""
    sim, host, store, traced = probe_sim()
    start = sim.now_ns
    sim.schedule(start + 50 * MS, lambda: sim._step(host, "second", b""))  # due before the completion below
    host.disk_latency_ns = 50 * MS
    sim._step(host, "first", b"")  # its flush completes at start + 50 ms, queued after "second"
    host.disk_latency_ns = 0
    sim.run_until(start + 50 * MS)
    assert [message for _, message in traced] == ["first", "second"]


def test_a_crash_before_a_slow_flush_completes_loses_the_flush_and_what_it_guarded():
    sim, host, store, traced = probe_sim()
    host.disk_latency_ns = 50 * MS
    start = sim.now_ns
    sim._step(host, "write", b"")
    sim.run_until(start + 10 * MS)
    sim.crash("probe", restart=False)
    sim.run_until(start + 200 * MS)
    assert traced == [] and store.flushes == 0


def test_a_stop_waits_for_a_process_busy_in_fsync_and_for_the_flushes_its_stop_begins():
    """As `railmq down` does: the simulator's seed 30364 stopped a replica while its slow disk
    held it in fsync, dropped the Stop and killed it, so it came back "uncleanly" and the only
    replica the partition could elect was refused; the partition stayed offline."""
    sim, host, store, traced = probe_sim()
    host.disk_latency_ns = 50 * MS
    start = sim.now_ns
    sim._step(host, "write", b"")  # busy in fsync until start + 50 ms

    sim.stop("probe")

    assert host.alive, "killed while its fsync ran"
    sim.run_until(start + STOP_WAIT_MAX_MS * MS)
    assert [message for _, message in traced][:1] == ["write"]
    assert any(isinstance(message, Stop) for _, message in traced), "the Stop was never handled"
    assert not host.alive and store.flushes == 2, "it exited before the flush its Stop began"


def test_a_stop_kills_a_process_that_stays_busy_past_the_wait():
    sim, host, store, traced = probe_sim()
    start = sim.now_ns
    host.paused_until_ns = start + 10 * STOP_WAIT_MAX_MS * MS  # stopped with SIGSTOP, say

    sim.stop("probe")
    sim.run_until(start + STOP_WAIT_MAX_MS * MS)

    assert not host.alive and traced == []


def test_a_kill_in_the_middle_of_a_flush_leaves_the_files_synced_before_it_durable():
    faults = SimFaultInjector()
    fs = MemoryFileSystem(faults)
    fs.make_directory("/d")
    first, second = fs.open("/d/a", create=True), fs.open("/d/b", create=True)
    first.append(b"aaaa")
    second.append(b"bbbb")
    faults.crash_after_fsyncs = 1
    first.sync()
    with pytest.raises(FsyncFailed):
        second.sync()
    assert fs.durable_content("/d/a") == b"aaaa"
    assert fs.durable_content("/d/b") == b""
    second.sync()  # the fault fired once; the disk works again
    assert fs.durable_content("/d/b") == b"bbbb"


def test_a_timer_fires_when_the_process_clock_reads_its_deadline_across_a_jump():
    sim, host, _, _ = probe_sim()
    start = sim.now_ns
    sim._step(host, "timer", b"")  # deadline: start + 100 ms on its own clock
    host.clock_offset_ns = 40 * MS  # the clock jumps 40 ms ahead
    sim.requeue_timers(host)
    sim.run_until(start + 59 * MS)
    assert host.actor.fired == []
    sim.run_until(start + 60 * MS)
    assert host.actor.fired == [start + 100 * MS]


def test_a_timer_waits_for_a_clock_that_jumped_back():
    sim, host, _, _ = probe_sim()
    start = sim.now_ns
    sim._step(host, "timer", b"")
    host.clock_offset_ns = -30 * MS
    sim.requeue_timers(host)
    sim.run_until(start + 129 * MS)
    assert host.actor.fired == []
    sim.run_until(start + 130 * MS)
    assert host.actor.fired == [start + 100 * MS]


@pytest.mark.parametrize("lost, late, arrives_ms", [(1.0, 0.0, None), (0.0, 0.0, 60), (0.0, 1.0, "after restart")])
def test_an_exit_notice_arrives_soon_late_or_never(lost, late, arrives_ms):
    sim = Simulator(3, SimConfig(faults=(), exit_notice_lost_probability=lost, exit_notice_late_probability=late))
    sent: list = []
    sim.send_as = lambda name, to, message: sent.append((sim.now_ns, message))
    host = SimpleNamespace(name="replica/sim/0/n1", node=1, state={"topic_partition": ("sim", 0)})
    start = sim.now_ns
    sim.faults._exit_notice(host, incarnation=7)
    sim.run_until(start + 5000 * MS)
    if arrives_ms is None:
        assert sent == []
        return
    [(at, notice)] = sent
    assert (notice.topic, notice.partition, notice.node, notice.incarnation) == ("sim", 0, 1, 7)
    if arrives_ms == "after restart":
        assert at > start + sim.config.restart_delay_ms * MS
    else:
        assert at == start + arrives_ms * MS


@pytest.mark.parametrize("paused", [False, True])
def test_the_cluster_stops_around_a_damaged_replica_only_if_the_others_can_stop_cleanly(paused, monkeypatch):
    """A disk fault may come with a restart of the whole cluster, the other replicas of the
    partition stopped as `railmq down` stops them (flushed first). One paused past the stop's wait
    is killed instead and loses its unflushed tail with the damaged replica's data — two replicas'
    worth at once (the simulator's seed 2097 with faults every 150-600 ms): then the damaged
    replica restarts alone."""
    sim = Simulator(5, SimConfig(faults=()))
    sim.build()
    sim.run_until(sim.now_ns + 2000 * MS)
    peer = sim.hosts["replica/sim/0/n3"]
    incarnation = peer.incarnation
    if paused:
        peer.paused_until_ns = sim.now_ns + 3000 * MS
    sim.disk.restart_cluster_probability = 1.0
    monkeypatch.setattr(sim_disk, "DISK_FAULTS", ("wipe",))

    assert sim.disk.inject(target="replica/sim/0/n1") == "wipe"
    sim.run_until(sim.now_ns + 1000 * MS)

    assert (peer.incarnation == incarnation) == paused, "a paused replica was stopped (killed) with the cluster"


def test_a_disk_fault_never_hits_the_only_replica_trusted_with_every_committed_write(monkeypatch):
    """The simulator's seed 2387 (denser faults): the ISR was node 3 alone, the ELR empty (node 2
    had died in a flush, so its restart was unclean), and node 3's disk went — two replicas' worth
    of loss; the partition stayed offline, by design. A disk fault hits a replica only while the
    coordinator trusts another one, still running, with every committed write."""
    sim = Simulator(5, SimConfig(faults=()))
    sim.build()
    sim.run_until(sim.now_ns + 2000 * MS)
    monkeypatch.setattr(sim_disk, "DISK_FAULTS", ("wipe",))
    coordinator = sim.coordinator()
    alone = sim.hosts["replica/sim/0/n3"].actor.incarnation
    coordinator.partitions[("sim", 0)] = msgspec.structs.replace(
        coordinator.partitions[("sim", 0)], isr=[3], isr_incarnations={3: alone}, elr={})

    assert sim.disk.inject(target="replica/sim/0/n3") is None
    assert sim.disk.inject(target="replica/sim/0/n1") == "wipe"  # node 3 still holds everything



def test_a_paused_replica_is_not_counted_on_to_hold_what_a_disk_fault_takes(monkeypatch):
    """The simulator's seed 3685 (denser faults): node 3 dead, node 2 paused for 1.8 s, and node
    1's disk wiped; the coordinator dropped node 2 from the ISR as dead, then node 3 for its
    unclean restart, and elected node 1 alone with nothing on its disk. A paused replica may be
    dropped from the ISR before it resumes: it is no holder to count on."""
    sim = Simulator(5, SimConfig(faults=()))
    sim.build()
    sim.run_until(sim.now_ns + 2000 * MS)
    monkeypatch.setattr(sim_disk, "DISK_FAULTS", ("wipe",))
    coordinator = sim.coordinator()
    record = coordinator.partitions[("sim", 0)]
    coordinator.partitions[("sim", 0)] = msgspec.structs.replace(
        record, isr=[1, 2], isr_incarnations={node: record.isr_incarnations.get(node, 0) for node in (1, 2)}, elr={})
    sim.hosts["replica/sim/0/n2"].paused_until_ns = sim.now_ns + 1800 * MS

    assert sim.disk.inject(target="replica/sim/0/n1") is None
    sim.hosts["replica/sim/0/n2"].paused_until_ns = sim.now_ns
    assert sim.disk.inject(target="replica/sim/0/n1") == "wipe"  # resumed: node 2 holds everything


@pytest.mark.parametrize("policy", ["every_batch", "interval"])
def test_no_replica_is_killed_while_another_of_its_partition_waits_to_repair_its_disk(policy, monkeypatch):
    """The simulator's seed 5140 (five nodes, denser faults, flushing every batch): a flipped byte
    waited for a leader to repair from, the ELR member was killed (an unclean restart leaves the
    ELR: the coordinator cannot know it lost nothing), the third replica had left the ISR, and
    nothing was left to elect. While a damaged replica is not repaired, no other replica of its
    partition takes a fault that may lose data; the damaged one itself may."""
    sim = Simulator(5, SimConfig(faults=(), flush_policy=policy))
    sim.build()
    sim.run_until(sim.now_ns + 2000 * MS)
    monkeypatch.setattr(sim_disk, "DISK_FAULTS", ("wipe",))

    assert sim.faults.may_lose_data("replica/sim/0/n2")
    assert sim.disk.inject(target="replica/sim/0/n1") == "wipe"

    assert not sim.faults.may_lose_data("replica/sim/0/n2")
    assert not sim.faults.may_lose_data("replica/sim/0/n3")
    assert sim.faults.may_lose_data("replica/sim/1/n2")  # another partition
    sim.run_until(sim.now_ns + 6000 * MS)  # repaired from the leader, back in the ISR, the unflushed window over
    assert sim.faults.may_lose_data("replica/sim/0/n2")


# ---------------------------------------------------------------------------- the share ledger


def ledger() -> ShareLedger:
    return ShareLedger(SimpleNamespace(problems=[], config=SimpleNamespace(share_visibility_timeout_ms=1000,
                                                                           share_max_delivery_attempts=3)))


GC = SimpleNamespace(kind="group-coordinator")


def acquire(book: ShareLedger, member: str, offset: int, count: int, at_ms: int, correlation: int) -> None:
    sender = member.encode()
    book.on_acquire(GC, ShareAcquireRequest(correlation_id=correlation, group_id="g", member_id=member, topic="t",
                                            partition=0, max_records=10), sender, at_ms * MS)
    book.on_acquired(GC, sender, ShareAcquireResponse(
        correlation_id=correlation, topic="t", partition=0, lock_deadline_ms=at_ms + 1000,
        acquired=[AcquiredRecords(first_offset=offset, last_offset=offset, delivery_count=count)]))


def answer(book: ShareLedger, member: str, offset: int, kind: str, at_ms: int, correlation: int, delay_ms: int = 0,
           count: int = 0) -> None:
    sender = member.encode()
    acknowledgement = ShareAcknowledgement(first_offset=offset, last_offset=offset, kind=kind, delay_ms=delay_ms,
                                           delivery_count=count)
    book.on_acknowledge(GC, ShareAcknowledgeRequest(correlation_id=correlation, group_id="g", member_id=member,
                                                    topic="t", partition=0, acknowledgements=[acknowledgement]),
                        sender, at_ms * MS)
    book.on_acknowledged(GC, sender, ShareAcknowledgeResponse(
        correlation_id=correlation, topic="t", partition=0,
        results=[ShareAcknowledgementResult(first_offset=offset, last_offset=offset)]))


def test_the_ledger_accepts_a_lock_that_expired_before_the_next_delivery():
    book = ledger()
    acquire(book, "a", 5, 1, at_ms=0, correlation=1)
    acquire(book, "b", 5, 2, at_ms=1001, correlation=2)
    answer(book, "b", 5, "accept", at_ms=1500, correlation=3, count=2)
    assert book.sim.problems == []


def test_the_ledger_sees_a_record_locked_by_two_members():
    book = ledger()
    acquire(book, "a", 5, 1, at_ms=0, correlation=1)
    acquire(book, "b", 5, 2, at_ms=500, correlation=2)
    assert book.sim.problems and "locked by two members" in book.sim.problems[0]


def test_the_ledger_sees_a_delivery_count_going_back():
    book = ledger()
    acquire(book, "a", 5, 2, at_ms=0, correlation=1)
    acquire(book, "b", 5, 2, at_ms=2000, correlation=2)
    assert any("delivery count went back" in problem for problem in book.sim.problems)


def test_the_ledger_sees_a_delivery_past_the_attempts_allowed():
    book = ledger()
    for count in (1, 2, 3, 4):
        acquire(book, "a", 5, count, at_ms=2000 * count, correlation=count)
    assert [problem for problem in book.sim.problems if "4th time" in problem]


def test_the_ledger_follows_each_copy_of_a_duplicated_request_to_its_own_answer():
    """The network duplicates an acquire; the coordinator answers both copies, the second with
    other records: the records of the second answer are locked too, by the same member."""
    book = ledger()
    request = ShareAcquireRequest(correlation_id=7, group_id="g", member_id="a", topic="t", partition=0,
                                  max_records=10)
    for _ in range(2):
        book.on_acquire(GC, request, b"a", 0)
    for offset in (5, 6):
        book.on_acquired(GC, b"a", ShareAcquireResponse(
            correlation_id=7, topic="t", partition=0, lock_deadline_ms=1000,
            acquired=[AcquiredRecords(first_offset=offset, last_offset=offset, delivery_count=1)]))
    answer(book, "a", 6, "accept", at_ms=100, correlation=8)
    assert book.sim.problems == []


def test_the_ledger_sees_a_redelivery_before_the_release_delay():
    book = ledger()
    acquire(book, "a", 5, 1, at_ms=0, correlation=1)
    answer(book, "a", 5, "release", at_ms=100, correlation=2, delay_ms=300)
    acquire(book, "b", 5, 2, at_ms=200, correlation=3)
    assert any("before its release delay" in problem for problem in book.sim.problems)


def test_the_ledger_takes_a_release_without_delay_as_available_at_once_whatever_the_clock_did():
    """The simulator's seed 2274 (denser faults): a record released with no delay at the group
    coordinator's 11,760.8 ms was acquired again after its clock jumped back 29 ms, at its
    11,754 ms: the ledger said "redelivered 7 ms before its release delay ended" — of a delay of
    0. A wall clock may go back; with no delay there is nothing to wait for."""
    book = ledger()
    acquire(book, "a", 5, 1, at_ms=0, correlation=1)
    answer(book, "a", 5, "release", at_ms=100, correlation=2, delay_ms=0)
    acquire(book, "b", 5, 2, at_ms=90, correlation=3)  # the coordinator's clock jumped back
    assert book.sim.problems == []


def test_the_ledger_sees_an_answer_from_a_member_without_the_lock():
    book = ledger()
    acquire(book, "a", 5, 1, at_ms=0, correlation=1)
    answer(book, "b", 5, "accept", at_ms=100, correlation=2)
    assert any("under the lock of a" in problem for problem in book.sim.problems)


def test_the_ledger_sees_an_accepted_record_delivered_again_and_checks_the_end():
    book = ledger()
    acquire(book, "a", 0, 1, at_ms=0, correlation=1)
    answer(book, "a", 0, "accept", at_ms=10, correlation=2)
    acquire(book, "b", 0, 2, at_ms=2000, correlation=3)
    assert any("after its accept was acknowledged" in problem for problem in book.sim.problems)
    book.sim.problems.clear()
    book.final_check("g", "t", {0: 3}, dead_letters=[("g", "t", 0, 1), ("g", "t", 0, 1)], dead_lettering=set())
    assert any("dead-lettered more than once" in problem for problem in book.sim.problems)
    assert any("1 records of t/0" in problem and "offset 2" in problem for problem in book.sim.problems)


def test_a_poison_value_is_every_thirteenth_of_a_producer():
    assert is_poison(b"producer-1:k2:26") and not is_poison(b"producer-1:k2:27")


# ---------------------------------------------------------------------------- one owner, send order


def test_two_members_holding_a_partition_in_one_generation_is_a_problem():
    shells = {"c1": SimpleNamespace(holdings=lambda: {("t", 0), ("t", 1)}),
              "c2": SimpleNamespace(holdings=lambda: {("t", 1)})}
    sim = SimpleNamespace(problems=[], shells=shells)
    watch = Invariants(sim)
    for name, generation in (("c1", 4), ("c2", 3)):
        watch._check_owners(SimpleNamespace(name=name, actor=SimpleNamespace(member=SimpleNamespace(generation=generation))))
    assert sim.problems == [], "a zombie of an older generation is fenced, not a second owner"
    watch._check_owners(SimpleNamespace(name="c2", actor=SimpleNamespace(member=SimpleNamespace(generation=4))))
    assert sim.problems == ["c2 and c1 both hold partitions [1] in generation 4"]


def test_a_producers_writes_out_of_send_order_are_a_problem():
    def sent(value: str, offset: int) -> dict:
        return {"type": "ok", "f": "send", "topic": "t", "process": "p", "partition": 0, "value": value,
                "offset": offset}
    sim = SimpleNamespace(problems=[], history=[sent("p:k:1", 10), sent("p:k:2", 11), sent("p:k:3", 12)])
    _check_send_order(sim, "t")
    assert sim.problems == []
    sim.history.append(sent("p:k:4", 9))
    _check_send_order(sim, "t")
    assert sim.problems and "out of send order" in sim.problems[0]


@pytest.mark.parametrize("argv, words", [
    (["--seeds", "-5"], "must be zero or more"),
    (["--seed", "-2"], "must be zero or more"),
    (["--duration-ms", "-5"], "must be a positive integer"),
    (["--steps", "-1"], "must be zero or more"),
])
def test_the_simulators_bad_flags_are_refused_before_anything_runs(argv, words, capsys):
    from chaos.sim_sweep import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)

    assert exited.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--sweep", "-1"], "must be zero or more"),
    (["--voters", "0"], "must be a positive integer"),
    (["--snapshot-chunk-bytes", "-1"], "must be zero or more"),
])
def test_the_raft_simulations_bad_flags_are_refused(argv, words, capsys):
    from chaos.sim_raft_sweep import main

    with pytest.raises(SystemExit) as exited:
        main(argv)

    assert exited.value.code == 2 and words in capsys.readouterr().err
