"""Pictures of things that happen over time: a leader failover, step by step; a consumer-group
rebalance, eager and cooperative."""

from __future__ import annotations

from svg import (
    AMBER, AMBER_PALE, BLUE, BLUE_PALE, GREEN, GREEN_PALE, INK, MUTED, PALE, PURPLE, PURPLE_PALE, RED, RED_PALE,
    RULE, Canvas,
)

# Failover: one row per process, one column per step; each cell (fill, ink, words).
FAILOVER_LANES = ("producer", "coordinator", "n1", "n2", "n3")
LEADER, FOLLOWER, DEAD, BUSY, CLIENT = (BLUE_PALE, BLUE), (PALE, INK), (RED_PALE, RED), (PURPLE_PALE, PURPLE), \
    (GREEN_PALE, GREEN)
FAILOVER_STEPS = [
    ("n1 leads epoch 3", {"producer": (CLIENT, "sends to n1"), "coordinator": (FOLLOWER, "hears heartbeats"),
                          "n1": (LEADER, "leader, epoch 3"), "n2": (FOLLOWER, "fetches, in ISR"),
                          "n3": (FOLLOWER, "fetches, in ISR")}),
    ("n1's process dies", {"producer": (BUSY, "connection drops"), "coordinator": (FOLLOWER, "heartbeats stop"),
                           "n1": (DEAD, "killed"), "n2": (BUSY, "fetch fails"), "n3": (BUSY, "fetch fails")}),
    ("an election", {"producer": (BUSY, "retries: no leader"), "coordinator": (BUSY, "after the session"),
                     "n1": (DEAD, "fenced (epoch 3)"), "n2": (LEADER, "elected: epoch 4"),
                     "n3": (FOLLOWER, "told: follow n2")}),
    ("clients move", {"producer": (CLIENT, "resends to n2"), "coordinator": (FOLLOWER, "ISR {n2, n3}"),
                      "n1": (DEAD, "restarting"), "n2": (LEADER, "acks = all again"), "n3": (FOLLOWER, "fetches n2")}),
    ("n1 returns", {"producer": (CLIENT, "no duplicates"), "coordinator": (FOLLOWER, "hears n1 again"),
                    "n1": (BUSY, "truncates, catches up"), "n2": (LEADER, "leader, epoch 4"),
                    "n3": (FOLLOWER, "in ISR")}),
    ("back in sync", {"producer": (CLIENT, "sends to n2"), "coordinator": (FOLLOWER, "ISR {n2, n3, n1}"),
                      "n1": (FOLLOWER, "follower, in ISR"), "n2": (LEADER, "leader, epoch 4"),
                      "n3": (FOLLOWER, "in ISR")}),
]


def failover() -> str:
    canvas = Canvas(1000, 470, "A leader failover, step by step",
                    "The leader's process dies; the coordinator elects a new leader from the ISR with a higher epoch; "
                    "clients move to it; the old leader returns as a follower, truncates and catches up.")
    canvas.text(20, 30, "A leader failover, step by step (railmq chaos run leader-kill)", css="title")
    left, top, width, height = 140, 70, 136, 52
    for column, (title, cells) in enumerate(FAILOVER_STEPS):
        x = left + column * (width + 4)
        canvas.badge(x + 10, top - 14, column + 1)
        canvas.text(x + 24, top - 10, title, css="body", weight="600")
        for row, lane in enumerate(FAILOVER_LANES):
            (fill, ink), words = cells[lane]
            y = top + row * (height + 6)
            canvas.rect(x, y, width, height, fill=fill, stroke=ink)
            canvas.text(x + width / 2, y + height / 2 + 4, words, css="small", anchor="middle", fill=ink)
    for row, lane in enumerate(FAILOVER_LANES):
        canvas.text(20, top + row * (height + 6) + height / 2 + 5, lane, css="head")
    canvas.lines(20, 385, [
        "1-2  Every message is proof of life; a dropped connection is proof of death, so clients react at once.",
        "3    The coordinator waits replica_session_timeout_ms, then picks a leader from the ISR, raises the epoch and",
        "     stores the decision before announcing it; an old leader is fenced by its lower epoch.",
        "4-6  Idempotent producers resend without duplicates; the old leader truncates by epoch and rejoins the ISR.",
    ], css="small", step=16)
    return canvas.render()


def _bars(canvas: Canvas, y: float, label: str, spans: list[tuple[float, float, str, tuple[str, str]]]) -> None:
    canvas.text(20, y + 18, label, css="head")
    for start, end, words, (fill, ink) in spans:
        canvas.rect(start, y, end - start, 26, fill=fill, stroke=ink)
        canvas.text((start + end) / 2, y + 17, words, css="small", anchor="middle", fill=ink)


def rebalance() -> str:
    canvas = Canvas(960, 500, "A consumer-group rebalance, eager and cooperative",
                    "When member B joins, an eager assignor stops every member before reassigning; cooperative-sticky "
                    "moves only the partitions that change owner.")
    canvas.text(20, 30, "A rebalance: member B joins a group where member A reads p0, p1, p2", css="title")
    canvas.text(20, 62, "eager (range, round-robin): everyone stops", css="head", fill=BLUE)
    _bars(canvas, 75, "member A", [(150, 400, "p0 p1 p2", (BLUE_PALE, BLUE)), (400, 560, "revoke: commit, stop",
                                                                                     (RED_PALE, RED)),
                                   (560, 940, "p0 p1", (BLUE_PALE, BLUE))])
    _bars(canvas, 110, "member B", [(400, 560, "JoinGroup, wait", (PALE, MUTED)), (560, 940, "p2", (GREEN_PALE, GREEN))])
    _bars(canvas, 145, "coordinator", [(150, 400, "Stable, generation 1", (PALE, MUTED)),
                                       (400, 560, "PreparingRebalance", (AMBER_PALE, AMBER)),
                                       (560, 940, "Stable, generation 2", (PALE, MUTED))])
    for x, number in ((400, 1), (480, 2), (560, 3)):
        canvas.line(x, 172, x, 178, stroke=RULE)
        canvas.badge(x, 190, number)
    canvas.text(580, 194, "nothing is read between 1 and 3: the stop-the-world pause", css="small")

    canvas.text(20, 262, "cooperative-sticky (KIP-429): only what moves stops", css="head", fill=GREEN)
    _bars(canvas, 275, "member A", [(150, 400, "p0 p1 p2", (BLUE_PALE, BLUE)), (400, 520, "p0 p1 (keeps)", (BLUE_PALE, BLUE)),
                                   (520, 600, "revoke p2", (RED_PALE, RED)), (600, 940, "p0 p1", (BLUE_PALE, BLUE))])
    _bars(canvas, 310, "member B", [(400, 660, "join, then rejoin", (PALE, MUTED)), (660, 940, "p2", (GREEN_PALE, GREEN))])
    _bars(canvas, 345, "coordinator", [(150, 400, "generation 1", (PALE, MUTED)), (400, 520, "generation 2",
                                                                                    (AMBER_PALE, AMBER)),
                                       (520, 660, "generation 3", (AMBER_PALE, AMBER)),
                                       (660, 940, "Stable, generation 3", (PALE, MUTED))])
    canvas.lines(20, 405, [
        "1  B's JoinGroup starts a rebalance; A hears it in a heartbeat answer (REBALANCE_IN_PROGRESS).",
        "2  An eager member revokes everything: its on_revoke commits processed offsets, then it rejoins.",
        "3  The leader member runs the assignor and hands the assignment over in SyncGroup; consumption resumes",
        "   from the committed offsets. Cooperative members keep what stays, give up only p2, and rejoin once more.",
    ], css="small", step=16)
    canvas.text(20, 480, "railmq consume orders --group billing --assignor cooperative-sticky  ·  "
                "railmq groups describe billing", css="mono", fill=MUTED)
    return canvas.render()
