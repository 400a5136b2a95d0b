"""Labs 7, 8 and 9: what replication promises across a leader failover, and what it does not.

Each lab works on one partition of a topic of its own, so it kills, pauses and cuts only that
partition's replica processes; the shared cluster's other topics never notice.

- lab 7: the leader's replication traffic is cut (the fault switch drops what it sends its
  followers), writes arrive, the leader is killed. With acks=1 every write the leader
  acknowledged alone is gone after the failover; with acks=all and min in-sync 2 none was
  acknowledged, and the producer's retries land them on the new leader;
- lab 8: replication factor 2, min in-sync 1, unclean election on: the follower falls out of the
  ISR, the leader acknowledges writes alone and stops, the stale follower is elected — and the
  writes only the old leader had are lost, named one by one;
- lab 9: a leader frozen past its session (SIGSTOP) is replaced; when it wakes up it learns the
  new epoch, and writes sent to it are refused (NOT_LEADER) instead of acknowledged.

The pictures are the chaos report's timeline (chaos/report.py): acknowledged writes per second,
fault bands and leader elections.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from actors.errors import ErrorCode
from actors.messages import LinkFault, ProduceRequest, ProduceResponse
from chaos.labs.framework import ARTICLE_GUIDE, Band, Lab, LabContext, LabResult, Measure, Plot, Series
from chaos.labs.plots import PALETTE
from chaos.labs.tools import leader_state, read_partition, wait_for
from chaos.links import ActorRef, peer_prefixes
from chaos.report import timeline_svg
from chaos.timeline import FaultBand, LeaderChange, Second, Timeline
from chaos.timeline import percentile_of_sorted as percentile
from railmq.producer import Producer
from storage.batch import encode_batch
from transport.rpc import RequestTimeout, RpcClient

PROBE_TIMEOUT_MS = 2000


def _counting(start_s: float, times: list[float]) -> list[tuple[float, float]]:
    """A running count: 0 at `start_s`, then one more at each of the (sorted) times."""
    return [(start_s, 0)] + [(t, count + 1) for count, t in enumerate(times)]


class Clock:
    """Seconds since the lab began, every write's send and acknowledgement, faults and elections."""

    def __init__(self) -> None:
        self.origin = time.monotonic()
        self.writes: list[list[Any]] = []  # [run label, sent s, acknowledged s or None, value]
        self.surviving: set[str] = set()  # values the final read found
        self.faults: list[FaultBand] = []
        self.leaders: list[LeaderChange] = []
        self.run = ""

    def now(self) -> float:
        return time.monotonic() - self.origin

    def fault(self, label: str, start_s: float, end_s: float | None = None) -> None:
        instantaneous = end_s is None
        self.faults.append(FaultBand(start_s=start_s, end_s=start_s + 0.25 if instantaneous else end_s,
                                     label=label, instantaneous=instantaneous))

    def sent(self, value: str) -> Callable[[Any], None]:
        entry = [self.run, self.now(), None, value]
        self.writes.append(entry)

        def acknowledged(future: Any) -> None:
            if future.exception(0) is None:
                entry[2] = self.now()
        return acknowledged

    def cumulative_plot(self) -> Plot:
        """Acknowledged writes over time, one line per run, the faults and elections as marks."""
        series = []
        for index, run in enumerate(dict.fromkeys(entry[0] for entry in self.writes)):
            times = sorted(entry[2] for entry in self.writes if entry[0] == run and entry[2] is not None)
            first_sent = min(entry[1] for entry in self.writes if entry[0] == run)
            color = PALETTE[index % len(PALETTE)]
            name = run or "writes"
            series.append(Series(f"{name}: acknowledged", _counting(first_sent, times), color, step=True))
            kept = sorted(entry[2] for entry in self.writes
                          if entry[0] == run and entry[2] is not None and entry[3] in self.surviving)
            if len(kept) < len(times):
                series.append(Series(f"{name}: acknowledged and still in the log",
                                     _counting(first_sent, kept), color, dashed=True, step=True))
        marks = [(band.start_s, band.label) for band in self.faults]
        marks += [(change.time_s, ("unclean: " if change.unclean else "elected ") + change.label)
                  for change in self.leaders]
        return Plot("acknowledged writes over time", "seconds", "acknowledged writes", series=series,
                    marks=marks)

    def timeline_plot(self) -> Plot:
        """The chaos report's timeline: acknowledgements and their latency per second, faults, elections."""
        end_s = max([self.now()] + [band.end_s for band in self.faults])
        seconds = []
        for second in range(int(end_s) + 1):
            latencies = sorted((acked - sent) * 1000 for _, sent, acked, _ in self.writes
                               if acked is not None and second <= acked < second + 1)
            seconds.append(Second(second=second, acknowledged=len(latencies),
                                  latency_ms_p50=percentile(latencies, 0.50) if latencies else None,
                                  latency_ms_p99=percentile(latencies, 0.99) if latencies else None))
        svg = timeline_svg(Timeline(seconds=seconds, faults=self.faults, leader_changes=self.leaders,
                                    heal_s=None, end_s=end_s))
        return Plot("the chaos report's timeline", "", "", series=[], svg=svg)

    def plots(self) -> list[Plot]:
        return [self.cumulative_plot(), self.timeline_plot()]


def _send(producer: Producer, clock: Clock, topic: str, value: str) -> Any:
    future = producer.send(topic, value, partition=0)
    future.add_done_callback(clock.sent(value))
    return future


def _new_leader(context: LabContext, topic: str, old_epoch: int, clock: Clock, unclean: bool = False) -> Any:
    state = wait_for(lambda: (lambda s: s if s.leader_endpoint and s.leader_epoch > old_epoch else None)(
        leader_state(context.bootstrap, topic)), 30, "a new leader")
    clock.leaders.append(LeaderChange(time_s=clock.now(),
                                      label=f"node {state.leader}, epoch {state.leader_epoch}",
                                      unclean=unclean))
    return state


def _values(context: LabContext, topic: str, clock: Clock | None = None) -> list[str]:
    values = [record.value.decode() for record in read_partition(context.bootstrap, topic, 0)]
    if clock is not None:
        clock.surviving.update(values)
    return values


def _caught_up(context: LabContext, topic: str, count: int) -> bool:
    state = leader_state(context.bootstrap, topic)
    return len(state.isr) == len(state.replicas) and all(
        info.log_end_offset >= count for info in state.replica_info)


# --------------------------------------------------------------------------- lab 7


def _endpoint(context: LabContext, name: str) -> str:
    """An actor's current endpoint, once the supervisor knows it. Never "": as a link fault's peer
    prefix, "" would match every peer and cut the leader off from everyone, the admin included."""
    return wait_for(lambda: context.cluster.actor(name).endpoint, 10, f"the endpoint of {name}")


def _failover(context: LabContext, acks: Any, writes: int, clock: Clock) -> dict[str, int]:
    topic = context.topic(f"acks{acks}", replication_factor=3, full_isr=True, min_insync_replicas=2)
    idempotent = acks == "all"
    producer = Producer(context.bootstrap, acks=acks, idempotent=idempotent,
                        client_id=context.name("lab-acks"),
                        request_timeout_ms=1000, retry_backoff_ms=50, delivery_timeout_ms=30_000)
    context.on_cleanup(lambda: producer.close(timeout=5))
    for index in range(10):
        _send(producer, clock, topic, f"before-{index}")
    producer.flush(20)
    wait_for(lambda: _caught_up(context, topic, 10), 20, "every replica to hold the first writes")
    old = leader_state(context.bootstrap, topic)
    leader = context.cluster.replica_name(topic, 0, old.leader)
    followers = [context.cluster.replica_name(topic, 0, node) for node in old.replicas if node != old.leader]
    peers = [prefix for name in followers
             for prefix in peer_prefixes(ActorRef(name, _endpoint(context, name), 0))]
    cut_s = clock.now()
    with context.fault_admin() as admin:
        admin.set_faults(old.leader_endpoint, [LinkFault(peers=peers, direction="out")])
    doomed = [_send(producer, clock, topic, f"during-{index}") for index in range(writes)]
    if acks == 1:
        wait_for(lambda: all(future.done() for future in doomed), 10, "the leader to acknowledge alone")
    else:
        time.sleep(0.5)  # long enough for any acknowledgement; well inside the 2 s lag time
    acknowledged_alone = sum(1 for future in doomed if future.done() and future.exception(0) is None)
    kill_s = clock.now()
    context.cluster.kill(leader)
    clock.fault(f"acks={acks}: cut {leader.split('/')[-1]} off its followers", cut_s, kill_s)
    clock.fault(f"kill -9 {leader.split('/')[-1]}", kill_s)
    _new_leader(context, topic, old.leader_epoch, clock)
    for index in range(5):
        _send(producer, clock, topic, f"after-{index}")
    producer.flush(30)
    acknowledged = {f"during-{index}" for index, future in enumerate(doomed) if future.exception(30) is None}
    stored = set(_values(context, topic, clock))
    context.say(f"  acks={acks}: {acknowledged_alone} of {writes} acknowledged while the followers were cut "
                f"off; after the failover {len(acknowledged - stored)} acknowledged writes are missing")
    return {"alone": acknowledged_alone, "acknowledged": len(acknowledged),
            "lost": len(acknowledged - stored)}


def acks_and_failover(context: LabContext, result: LabResult) -> None:
    writes = 10 if context.quick else 30
    clock = Clock()
    context.say(f"RF 3, min in-sync 2; the leader cannot reach its followers, {writes} writes arrive, "
                "the leader dies")
    clock.run = "acks=1"
    one = _failover(context, 1, writes, clock)
    clock.run = "acks=all"
    every = _failover(context, "all", writes, clock)
    result.measures += [
        Measure("acks=1: acknowledged by the leader alone", writes, Band.exactly(writes), one["alone"]),
        Measure("acks=1: acknowledged writes lost", writes, Band.exactly(writes), one["lost"],
                how="every write no follower had"),
        Measure("acks=all: acknowledged while the followers were cut off", 0, Band.exactly(0),
                every["alone"]),
        Measure("acks=all: acknowledged writes lost", 0, Band.exactly(0), every["lost"]),
        Measure("acks=all: those writes acknowledged after the failover", writes, Band.exactly(writes),
                every["acknowledged"], how="the producer retried them to the new leader"),
    ]
    result.plots += clock.plots()


# --------------------------------------------------------------------------- lab 8


def unclean_election(context: LabContext, result: LabResult) -> None:
    safe, doomed_count = 10, 5
    clock = Clock()
    topic = context.topic("unclean", replication_factor=2, full_isr=True, min_insync_replicas=1,
                          unclean_leader_election=True)
    state = leader_state(context.bootstrap, topic)
    leader = context.cluster.replica_name(topic, 0, state.leader)
    follower_node = next(node for node in state.replicas if node != state.leader)
    follower = context.cluster.replica_name(topic, 0, follower_node)
    context.say("RF 2, min in-sync 1, unclean election on: the follower falls behind, the leader stops, "
                "the follower is elected anyway")
    resumed: set[str] = set()

    def resume(name: str) -> None:
        if name not in resumed:
            resumed.add(name)
            context.cluster.resume(name)
    context.on_cleanup(lambda: [resume(name) for name in (leader, follower)])
    with Producer(context.bootstrap, acks=1, client_id="lab-unclean") as producer:
        for index in range(safe):
            _send(producer, clock, topic, f"safe-{index}")
        producer.flush(20)
        wait_for(lambda: _caught_up(context, topic, safe), 20, "the follower to copy the first writes")
        paused_s = clock.now()
        context.cluster.pause(follower)
        wait_for(lambda: leader_state(context.bootstrap, topic).isr == [state.leader], 20,
                 "the ISR to drop the stalled follower")
        doomed = [_send(producer, clock, topic,
                        f"doomed-{index}").result(20) for index in range(doomed_count)]
        leader_paused_s = clock.now()
        context.cluster.pause(leader)
        resumed.discard(follower)
        resume(follower)
        clock.fault(f"pause {follower.split('/')[-1]} (follower)", paused_s, clock.now())
        elected = _new_leader(context, topic, state.leader_epoch, clock, unclean=True)
    with Producer(context.bootstrap, acks=1, client_id="lab-unclean-after") as producer:
        replaced = _send(producer, clock, topic, "after-unclean").result(20)
    resume(leader)
    clock.fault(f"pause {leader.split('/')[-1]} (old leader)", leader_paused_s, clock.now())
    wait_for(lambda: len(leader_state(context.bootstrap, topic).isr) == 2, 30, "the old leader to rejoin")
    values = _values(context, topic, clock)
    lost = [f"doomed-{index}" for index in range(doomed_count) if f"doomed-{index}" not in values]
    context.say(f"  elected node {elected.leader} (epoch {elected.leader_epoch}); "
                f"lost: {', '.join(lost) or 'nothing'}")
    for metadata, value in zip(doomed, (f"doomed-{index}" for index in range(doomed_count))):
        if value in lost:
            result.facts.append(f"lost {value}: acknowledged at {topic}/0@{metadata.offset} by node "
                                f"{state.leader}, which no other replica had")
    trace = open(context.cluster.trace_path, encoding="utf-8").read() if context.cluster.trace_path else ""
    result.measures += [
        Measure("acknowledged writes lost", doomed_count, Band.exactly(doomed_count), len(lost),
                how="exactly those acknowledged while the follower was out of the ISR"),
        Measure("offset of the first write after the election", safe, Band.exactly(safe), replaced.offset,
                how="the new leader reuses the lost writes' offsets"),
        Measure("writes from before the follower fell behind, kept", safe, Band.exactly(safe),
                sum(1 for value in values if value.startswith("safe-"))),
        Measure("unclean election traced (1 = yes)", 1, Band.exactly(1),
                1 if "unclean-election" in trace else 0),
    ]
    result.plots += clock.plots()


# --------------------------------------------------------------------------- lab 9


def _probe(endpoint: str, topic: str, value: bytes) -> str:
    """Send one acks=all write straight to `endpoint`; the error name it answers ('NONE': taken)."""
    rpc = RpcClient("lab-zombie-probe")
    try:
        reply = rpc.request(endpoint, ProduceRequest(correlation_id=0, topic=topic, partition=0, acks=-1,
                                                     timeout_ms=PROBE_TIMEOUT_MS,
                                                     batch=encode_batch([(0, None, value, None)], 1)),
                            timeout_ms=PROBE_TIMEOUT_MS)
    except (RequestTimeout, TimeoutError):
        return "NO_ANSWER"
    finally:
        rpc.close()
    return ErrorCode(reply.error).name if isinstance(reply, ProduceResponse) else type(reply).__name__


def zombie_leader(context: LabContext, result: LabResult) -> None:
    writes, probes = 5, 5
    clock = Clock()
    topic = context.topic("zombie", replication_factor=3, full_isr=True, min_insync_replicas=2)
    old = leader_state(context.bootstrap, topic)
    zombie = context.cluster.replica_name(topic, 0, old.leader)
    context.say(f"RF 3: freeze the leader ({zombie.split('/')[-1]}, epoch {old.leader_epoch}) past its "
                "session, write meanwhile, wake it up")
    producer = Producer(context.bootstrap, acks="all", idempotent=True, client_id="lab-zombie",
                        request_timeout_ms=1000, retry_backoff_ms=50, delivery_timeout_ms=30_000)
    context.on_cleanup(lambda: producer.close(timeout=5))
    _send(producer, clock, topic, "before").result(20)
    frozen_s = clock.now()
    context.cluster.pause(zombie)
    woken = [False]

    def wake() -> None:
        if not woken[0]:
            woken[0] = True
            context.cluster.resume(zombie)
    context.on_cleanup(wake)
    during = [_send(producer, clock, topic, f"during-{index}") for index in range(writes)]
    elected = _new_leader(context, topic, old.leader_epoch, clock)
    acknowledged = sum(1 for future in during if future.exception(30) is None)
    wake()
    clock.fault(f"SIGSTOP {zombie.split('/')[-1]} (leader)", frozen_s, clock.now())
    answers = [_probe(old.leader_endpoint, topic, f"zombie-{index}".encode()) for index in range(probes)]
    refused = sum(1 for answer in answers if answer not in ("NONE", "NO_ANSWER"))
    wait_for(lambda: old.leader in leader_state(context.bootstrap, topic).isr, 30,
             "the old leader to catch up")
    values = _values(context, topic, clock)
    context.say(f"  new leader node {elected.leader}, epoch {elected.leader_epoch}; the woken leader "
                f"answered {', '.join(sorted(set(answers)))}")
    result.measures += [
        Measure("leader epoch after the freeze", old.leader_epoch + 1,
                Band(old.leader_epoch + 1, old.leader_epoch + 3),
                elected.leader_epoch, how="a new leader, a higher epoch"),
        Measure("writes sent during the freeze, acknowledged by the new leader", writes, Band.exactly(writes),
                acknowledged),
        Measure("writes to the woken leader refused", probes, Band.exactly(probes), refused),
        Measure("the woken leader's writes in the log", 0, Band.exactly(0),
                sum(1 for value in values if value.startswith("zombie-"))),
        Measure("acknowledged writes in the log, once each", writes + 1, Band.exactly(writes + 1),
                len({value for value in values if not value.startswith("zombie-")})),
    ]
    result.facts.append(f"The woken leader answered {answers[0]} to a write: it learned epoch "
                        f"{elected.leader_epoch} from the coordinator and stepped down instead of accepting "
                        f"as leader of epoch {old.leader_epoch}.")
    result.plots += clock.plots()


LABS = [
    Lab(7, "acks-and-failover", "acks=1 loses acknowledged writes at a failover; acks=all does not",
        ARTICLE_GUIDE,
        "\"Whether an acknowledged write survives losing a machine depends on settings: in Kafka, a producer "
        "with acks=all gets its reply only after the in-sync replicas hold the message, and "
        "min.insync.replicas sets the least number of in-sync copies a write needs. If the leader fails, the "
        "controller elects a new leader from the in-sync replicas.\"", acks_and_failover,
        "acks=1: every write the leader acknowledged alone is lost; acks=all: none acknowledged early, "
        "none lost"),
    Lab(8, "unclean-election", "unclean leader election loses data, message by message", ARTICLE_GUIDE,
        "\"If the leader fails, the controller elects a new leader from the in-sync replicas.\" An unclean "
        "election breaks that rule: a replica outside the ISR leads, and \"whether an acknowledged write "
        "survives losing a machine depends on settings\" — here it does not.", unclean_election,
        "the lost writes by name, and the new leader reusing their offsets"),
    Lab(9, "zombie-leader", "a paused leader is fenced by its epoch", ARTICLE_GUIDE,
        "\"If the leader fails, the controller elects a new leader from the in-sync replicas.\" A leader "
        "that was only frozen comes back believing it still leads; the epoch the controller gave the new "
        "leader is what makes its late writes fail instead of splitting the partition's "
        "history.", zombie_leader,
        "the new epoch, and every write to the woken leader refused"),
]
