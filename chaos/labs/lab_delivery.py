"""Labs 1, 2 and 12: when the acknowledgement is sent decides what a crash costs.

A consumer process (chaos/labs/crash_worker.py) reads a partition in a classic group and kills
itself with SIGKILL at random, right between two steps of handling a record; it is restarted
until it has committed everything. Its log says what it processed, committed, and how much was
uncommitted at each crash, so every figure below is counted, not inferred:

- lab 1: commit after processing (at-least-once) — a crash replays what was processed since
  the last commit: one message per crash when committing each, up to a batch when batching;
- lab 2: commit before processing (at-most-once) — a crash loses the record it had committed;
- lab 12: the idempotent producer removes the duplicates that producer retries write, but a side
  effect outside the broker (a balance in SQLite) is still applied twice unless the consumer is
  idempotent (railmq.idempotent.IdempotentStore).
"""

from __future__ import annotations

import random
import time

from actors.messages import LinkFault
from chaos.labs.crash_worker import (
    AFTER, BEFORE, IDEMPOTENT_BALANCE, NAIVE_BALANCE, WorkerSpec, read_balances, run_until_done,
)
from chaos.labs.duplicates_sim import DuplicatesConfig, simulate_duplicates
from chaos.labs.framework import (
    ARTICLE_GUIDE, ARTICLE_QUESTIONS, Band, Lab, LabContext, LabResult, Measure, Plot, Series,
)
from chaos.labs.tools import leader_state, produce, read_partition, wait_for
from railmq.producer import Producer
from railmq.sizing import duplicates_sigma, expected_duplicates

# The leader's answers to the producer are dropped this long: three of its 300 ms request timeouts.
ANSWERS_DROPPED_S = 1.0
REQUEST_TIMEOUT_S = 0.3
SIGMAS = 3.5  # statistical bands: a correct system fails one in a few thousand runs


def _statistical(expected: float, sigma: float) -> Band:
    return Band(max(0.0, expected - SIGMAS * sigma), expected + SIGMAS * sigma)


def _fill(context: LabContext, prefix: str, count: int, values: list[str] | None = None) -> str:
    topic = context.topic(prefix)
    produce(context.bootstrap, topic, values or [f"m{index}" for index in range(count)], partition=0, acks=1)
    return topic


# --------------------------------------------------------------------------- lab 1


def crash_before_commit(context: LabContext, result: LabResult) -> None:
    messages, probability, batch = (300, 0.03, 10) if context.quick else (1000, 0.02, 10)
    runs = {}
    for commit_every in (1, batch):
        topic = _fill(context, "dup", messages)
        context.say(f"{messages} messages; the consumer crashes after processing with probability "
                    f"{probability:g} and commits every {commit_every}")
        runs[commit_every] = run_until_done(WorkerSpec(
            bootstrap=context.bootstrap, topic=topic, group=context.name("g"), end_offset=messages,
            log_path=context.path(f"worker-{commit_every}.log"), delivery=AFTER, commit_every=commit_every,
            crash_probability=probability, seed=context.seed))
        run = runs[commit_every]
        context.say(f"  {run.incarnations} processes, {run.crashes} crashes, {run.duplicates} processed "
                    f"twice, {len(run.lost(messages))} lost, in {run.elapsed_s:.1f} s")
    per_message, per_batch = runs[1], runs[batch]
    for commit_every, run in runs.items():
        label = "commit per message" if commit_every == 1 else f"commit per batch of {commit_every}"
        expected = expected_duplicates(messages, probability, commit_every)
        spread = duplicates_sigma(messages, probability, commit_every)
        result.measures.append(Measure(
            f"duplicates, {label}", expected, _statistical(expected, spread), run.duplicates,
            how="N (((1 - p)^-B - 1) / (p B) - 1), ±3.5σ"))
        result.measures.append(Measure(
            f"duplicates = uncommitted at the crashes, {label}", sum(run.crashes_uncommitted),
            Band.exactly(sum(run.crashes_uncommitted)), run.duplicates,
            how="sum over crashes of the records processed since the last commit"))
        result.measures.append(Measure(f"lost, {label}", 0, Band.exactly(0), len(run.lost(messages))))
    replayed = per_message.duplicates / per_message.crashes if per_message.crashes else None
    result.measures.append(Measure("replayed per crash, commit per message", 1, Band.exactly(1), replayed))
    simulated = simulate_duplicates(DuplicatesConfig(messages=10_000 if context.quick else 50_000,
                                                     crash_probability=0.01, seed=context.seed))
    scaled = simulated.duplicates * 1_000_000 / simulated.config.messages
    sigma = duplicates_sigma(simulated.config.messages, 0.01, 1) * 1_000_000 / simulated.config.messages
    million = expected_duplicates(1_000_000, 0.01, 1)
    result.measures.append(Measure(
        "simulated duplicates per 1,000,000 at 1% (articles: 10,028)", million, _statistical(million, sigma),
        scaled, how=f"{simulated.config.messages:,} messages on the consumer-group state machines"))
    result.facts.append("Committing per message, every crash replayed exactly the one message it had "
                        f"processed ({per_message.crashes} crashes, {per_message.duplicates} duplicates).")
    result.facts.append(f"Committing per batch of {batch}, a crash replayed "
                        f"{per_batch.duplicates / max(1, per_batch.crashes):.1f} messages on average "
                        f"({per_batch.crashes} crashes, {per_batch.duplicates} duplicates): fewer commit "
                        "writes, more work done twice.")
    result.plots.append(Plot(
        "duplicates: expected and measured", "", "messages processed twice", kind="bar",
        categories=["per message, expected", "per message, measured", f"per {batch}, expected",
                    f"per {batch}, measured"],
        series=[Series("duplicates", [
            (0, expected_duplicates(messages, probability, 1)), (1, per_message.duplicates),
            (2, expected_duplicates(messages, probability, batch)), (3, per_batch.duplicates)])]))
    result.plots.append(Plot(
        "replayed at each crash", "crash number", "records replayed", series=[
            Series("commit per message",
                   [(index + 1, value) for index, value in enumerate(per_message.crashes_uncommitted)]),
            Series(f"commit per batch of {batch}", [(index + 1, value) for index, value in
                                                    enumerate(per_batch.crashes_uncommitted)])]))


# --------------------------------------------------------------------------- lab 2


def ack_before_processing(context: LabContext, result: LabResult) -> None:
    messages, probability = (200, 0.03) if context.quick else (600, 0.02)
    topic = _fill(context, "amo", messages)
    context.say(f"{messages} messages; the consumer commits first, then crashes with probability "
                f"{probability:g} before processing")
    run = run_until_done(WorkerSpec(
        bootstrap=context.bootstrap, topic=topic, group=context.name("g"), end_offset=messages,
        log_path=context.path("worker.log"), delivery=BEFORE, crash_probability=probability,
        seed=context.seed))
    lost = run.lost(messages)
    context.say(f"  {run.incarnations} processes, {run.crashes} crashes, {len(lost)} lost, "
                f"{run.duplicates} duplicates")
    expected = messages * probability
    sigma = (messages * probability * (1 - probability)) ** 0.5
    result.measures += [
        Measure("lost messages", expected, _statistical(expected, sigma), len(lost),
                how="N p (each record has one try)"),
        Measure("lost per crash", 1, Band.exactly(1), len(lost) / run.crashes if run.crashes else None),
        Measure("processed twice", 0, Band.exactly(0), run.duplicates),
    ]
    shown = ", ".join(f"@{offset}" for offset in lost[:12]) + (" ..." if len(lost) > 12 else "")
    result.facts.append(f"Lost, never processed by anyone: offsets {shown}. Each was committed, then its "
                        "consumer died.")
    result.plots.append(Plot("at-most-once: what each crash cost", "", "messages", kind="bar",
                             categories=["crashes", "lost", "processed twice"],
                             series=[Series("count",
                                            [(0, run.crashes), (1, len(lost)), (2, run.duplicates)])]))


# --------------------------------------------------------------------------- lab 12


def _retry_duplicates(context: LabContext, idempotent: bool, records: int) -> tuple[int, int, int]:
    """(records stored, distinct values stored, acknowledged): replies from the leader to this
    producer are dropped for a while, so its requests time out and are sent again."""
    topic = context.topic("retry")
    client_id = context.name("lab-retry")
    leader = leader_state(context.bootstrap, topic)
    producer = Producer(context.bootstrap, acks=1, idempotent=idempotent, client_id=client_id,
                        request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000), retry_backoff_ms=50,
                        delivery_timeout_ms=30_000, linger_ms=0, max_in_flight=1)
    with producer, context.fault_admin() as admin:
        producer.partitions_for(topic)
        admin.set_faults(leader.leader_endpoint, [LinkFault(peers=[f"{client_id}|"], direction="out")])
        try:
            futures = [producer.send(topic, f"order-{index}", partition=0) for index in range(records)]
            wait_for(lambda: admin.list_offsets(topic, 0, -1).log_end_offset >= 1, 20,
                     "the leader to append")
            time.sleep(ANSWERS_DROPPED_S)  # timeouts pass, retries go out, their answers are dropped too
        finally:
            admin.set_faults(leader.leader_endpoint, [])
        acknowledged = sum(1 for future in futures if future.exception(30) is None)
    stored = read_partition(context.bootstrap, topic, 0)
    return len(stored), len({record.value for record in stored}), acknowledged


def exactly_once_boundary(context: LabContext, result: LabResult) -> None:
    records = 10 if context.quick else 20
    context.say(f"producer retries: {records} records, the leader's answers to the producer dropped for "
                "a second")
    plain = _retry_duplicates(context, idempotent=False, records=records)
    safe = _retry_duplicates(context, idempotent=True, records=records)
    for label, (stored, distinct, acknowledged) in (("plain producer", plain), ("idempotent producer", safe)):
        context.say(f"  {label}: {stored} records stored for {distinct} distinct values, "
                    f"{acknowledged} acknowledged")
    result.measures += [
        Measure("retry duplicates in the log, plain producer",
                records * int(ANSWERS_DROPPED_S / REQUEST_TIMEOUT_S),
                Band(1, float("inf")), plain[0] - plain[1],
                how="about one copy per request timeout while answers were dropped; at least one"),
        Measure("retry duplicates in the log, idempotent producer", 0, Band.exactly(0), safe[0] - safe[1]),
        Measure("distinct records stored, both producers", records, Band.exactly(records),
                min(plain[1], safe[1])),
    ]
    events, probability, commit_every = (120, 0.04, 5) if context.quick else (300, 0.03, 5)
    rng = random.Random(context.seed)
    deposits = [(f"acct-{rng.randrange(6)}", rng.randint(1, 500)) for _ in range(events)]
    truth: dict[str, int] = {}
    for account, amount in deposits:
        truth[account] = truth.get(account, 0) + amount
    outcomes = {}
    for processing in (NAIVE_BALANCE, IDEMPOTENT_BALANCE):
        topic = _fill(context, "deposits", events, [f"{account}:{amount}" for account, amount in deposits])
        database = context.path(f"{processing}.db")
        run = run_until_done(WorkerSpec(
            bootstrap=context.bootstrap, topic=topic, group=context.name("g"), end_offset=events,
            log_path=context.path(f"{processing}.log"), delivery=AFTER, commit_every=commit_every,
            crash_probability=probability, seed=context.seed, processing=processing, database=database))
        balances = read_balances(database)
        applied = sum(count for _, count in balances.values())
        wrong = sum(abs(balances.get(account, (0, 0))[0] - total) for account, total in truth.items())
        outcomes[processing] = (run, applied, wrong)
        context.say(f"  {processing}: {run.crashes} crashes, {run.duplicates} redeliveries, {applied} "
                    f"deposits applied for {events} events, balances off by {wrong} in all")
    naive_run, naive_applied, naive_wrong = outcomes[NAIVE_BALANCE]
    idem_run, idem_applied, idem_wrong = outcomes[IDEMPOTENT_BALANCE]
    result.measures += [
        Measure("deposits applied twice, naive consumer", sum(naive_run.crashes_uncommitted),
                Band.exactly(sum(naive_run.crashes_uncommitted)), naive_applied - events,
                how="every record processed but not committed at a crash is applied again"),
        Measure("deposits applied twice, idempotent consumer", 0, Band.exactly(0), idem_applied - events),
        Measure("balance error, idempotent consumer", 0, Band.exactly(0), idem_wrong),
        Measure("redeliveries the idempotent consumer skipped", sum(idem_run.crashes_uncommitted),
                Band.exactly(sum(idem_run.crashes_uncommitted)), idem_run.duplicates),
    ]
    result.facts.append("The broker redelivered to both consumers; the naive one added "
                        f"{naive_applied - events} deposits again (balances off by {naive_wrong}), the "
                        "idempotent one skipped every redelivery.")
    result.plots.append(Plot("where exactly-once stops", "", "records / deposits", kind="bar",
                             categories=["retry copies, plain", "retry copies, idempotent",
                                         "double deposits, naive", "double deposits, idempotent"],
                             series=[Series("count", [
                                 (0, plain[0] - plain[1]), (1, safe[0] - safe[1]),
                                 (2, naive_applied - events), (3, idem_applied - events)])]))


LABS = [
    Lab(1, "crash-before-commit", "a crash between processing and commit means duplicates", ARTICLE_GUIDE,
        "\"Ack after processing: a crash in between means the broker never saw the ack and delivers the "
        "message again, so delivery is at-least-once.\" In a log the ack is an offset commit, \"so a crash "
        "replays everything since the last commit\": \"1,000,000 simulated messages produced 10,028 "
        "duplicates; committing once per batch would replay more messages per crash.\"", crash_before_commit,
        "duplicates against the formula; replayed per crash is exactly 1 when committing each message"),
    Lab(2, "ack-before-processing", "acknowledging before processing loses messages", ARTICLE_GUIDE,
        "\"Ack before processing: a crash in between loses the message, so delivery is at-most-once.\" The "
        "common mistake: \"We ack first so we never process twice\" — wrong: \"A crash after the ack loses "
        "the "
        "message.\"", ack_before_processing, "lost equals the crashes, one each; nothing is processed twice"),
    Lab(12, "exactly-once-boundary", "where exactly-once stops", ARTICLE_QUESTIONS,
        "\"Exactly-once delivery across a network is not achievable in the general case ... What real "
        "systems provide is at-least-once delivery plus an idempotent consumer.\" The interview guide adds "
        "that \"a producer that times out and resends may store the message twice unless the broker "
        "deduplicates it\", and that broker exactly-once does not cover \"a side effect in an external "
        "system\".",
        exactly_once_boundary,
        "retry copies: some without idempotence, none with it; double deposits: naive > 0, idempotent 0"),
]
