"""Pictures of logs and records: replication with the ISR, the high watermark and truncation by
epoch; the share-group record states; the data path through sockets and shared-memory rings."""

from __future__ import annotations

from svg import (
    AMBER, AMBER_PALE, BLUE, BLUE_PALE, GREEN, GREEN_PALE, INK, MUTED, PALE, PURPLE, PURPLE_PALE, RED, RED_PALE,
    RULE, Canvas,
)

CELL = 34  # one offset of a log, in the log pictures
LABEL_WIDTH = 240  # the replica's name and note, left of its log


def _log_row(canvas: Canvas, x: float, y: float, label: str, note: str, epochs: list[int | str],
             crossed: set[int] = frozenset(), first_offset: int = 0) -> None:
    """One replica's log: a cell per offset, coloured by the epoch it was written in."""
    canvas.text(x, y + 15, label, css="head")
    canvas.text(x, y + 31, note, css="small")
    left = x + LABEL_WIDTH
    for index, epoch in enumerate(epochs):
        offset = first_offset + index
        fill, ink = {2: (PALE, INK), 3: (BLUE_PALE, BLUE), 4: (GREEN_PALE, GREEN)}.get(epoch, (AMBER_PALE, AMBER)) \
            if isinstance(epoch, int) else (AMBER_PALE, AMBER)
        if offset in crossed:
            fill, ink = RED_PALE, RED
        canvas.rect(left + index * CELL, y, CELL - 3, 30, fill=fill, stroke=ink)
        canvas.text(left + index * CELL + (CELL - 3) / 2, y + 19, str(offset), css="mono", anchor="middle", fill=ink)
        if offset in crossed:
            canvas.line(left + index * CELL + 3, y + 27, left + index * CELL + CELL - 6, y + 3, stroke=RED, width=2)


def replication() -> str:
    canvas = Canvas(900, 570, "Replication: the in-sync replicas, the high watermark, truncation by epoch",
                    "Three replica logs of one partition; the high watermark is the end of what every in-sync "
                    "replica holds; a returning old leader truncates what it wrote in an epoch that ended earlier.")
    canvas.text(20, 30, "One partition: a leader, its followers, the ISR and the high watermark", css="title")
    left = 20 + LABEL_WIDTH
    _log_row(canvas, 20, 60, "n1  leader", "epoch 3, log end offset 10", [2] * 5 + [3] * 5)
    _log_row(canvas, 20, 110, "n2  follower, in ISR", "fetches from n1, log end 9", [2] * 5 + [3] * 4)
    _log_row(canvas, 20, 160, "n3  follower, out of ISR", "lagged > replica_lag_time_max_ms", [2] * 5 + [3] * 1)
    mark = left + 9 * CELL - 1.5
    canvas.line(mark, 50, mark, 205, stroke=PURPLE, width=2.5)
    canvas.text(mark + 6, 54, "high watermark 9", css="head", fill=PURPLE)
    canvas.text(left + 10 * CELL + 10, 74, "= the smallest log end among", css="small")
    canvas.text(left + 10 * CELL + 10, 88, "the in-sync replicas {n1, n2}", css="small")
    canvas.lines(20, 240, [
        "Consumers read only below the high watermark (offsets 0..8); acks=all answers a producer once every",
        "in-sync replica holds its batch and at least min_insync_replicas do. n3 fell behind, so the leader took it",
        "out of the ISR: it no longer holds the high watermark back, and it comes back once it has caught up.",
    ], css="body")
    for row, (fill, ink, words) in enumerate([(PALE, INK, "written in epoch 2"), (BLUE_PALE, BLUE, "written in epoch 3"),
                                              (GREEN_PALE, GREEN, "written in epoch 4")]):
        canvas.rect(left + 10 * CELL + 110, 112 + row * 24, 14, 14, fill=fill, stroke=ink)
        canvas.text(left + 10 * CELL + 130, 124 + row * 24, words, css="small")

    canvas.text(20, 320, "Truncation by leader epoch (KIP-101, KIP-279)", css="title")
    _log_row(canvas, 20, 345, "n1 as it dies", "epoch 3 leader; high watermark 5", [2] * 3 + [3] * 4)
    _log_row(canvas, 20, 395, "n2 elected", "epoch 4 from the ISR; writes 5..8", [2] * 3 + [3] * 2 + [4] * 4)
    _log_row(canvas, 20, 445, "n1 back as follower", "truncates to 5, then fetches", [2] * 3 + [3] * 2 + [3] * 2,
             crossed={5, 6})
    canvas.badge(left + 7 * CELL + 24, 460, 1)
    canvas.text(left + 7 * CELL + 40, 458, "n1 asks: where does epoch 3 end?", css="small")
    canvas.text(left + 7 * CELL + 40, 473, "n2 answers 5, so n1 cuts 5 and 6", css="small")
    canvas.lines(20, 505, [
        "Offsets 5 and 6 of epoch 3 were above the high watermark when n1 died: no acks=all producer was told they were",
        "written, so cutting them loses nothing acknowledged. An unclean election (a replica outside the ISR takes over)",
        "can cut acknowledged records; railmq does it only when a topic asks, and the chaos report names each one.",
    ], css="small", step=15)
    return canvas.render()


def share_states() -> str:
    canvas = Canvas(900, 420, "The life of a record in a share group (KIP-932)",
                    "Available, acquired, accepted, dead-lettering and archived, with the events that move a record "
                    "between them.")
    canvas.text(20, 30, "A record in a share group: acquired by one member at a time, answered one by one", css="title")
    canvas.box(30, 70, 170, 70, "available", ["ready for any member", "(delivery count kept)"], fill=PALE)
    canvas.box(300, 70, 230, 90, "acquired", ["locked to one member until the", "visibility timeout; delivery",
                                              "count + 1"], fill=BLUE_PALE, stroke=BLUE)
    canvas.box(640, 70, 220, 70, "accepted", ["done: the start offset moves", "past it"], fill=GREEN_PALE, stroke=GREEN)
    canvas.box(300, 240, 230, 70, "dead-lettering", ["being written to <topic>.dlq,", "exactly once"],
               fill=AMBER_PALE, stroke=AMBER)
    canvas.box(660, 240, 210, 70, "archived", ["in the dead-letter topic with", "reason and last error"],
               fill=AMBER_PALE, stroke=AMBER)
    canvas.line(200, 95, 298, 95, stroke=BLUE, arrow=True)
    canvas.text(249, 88, "acquire", css="small", anchor="middle")
    canvas.line(530, 100, 638, 100, stroke=GREEN, arrow=True)
    canvas.text(584, 93, "accept", css="small", anchor="middle")
    canvas.path("M 300 145 C 250 180, 150 180, 115 142", stroke=MUTED, arrow=True)
    canvas.text(210, 192, "release (after its delay), lock expiry,", css="small", anchor="middle")
    canvas.text(210, 206, "or the member's session ends", css="small", anchor="middle")
    canvas.line(415, 160, 415, 238, stroke=AMBER, arrow=True)
    canvas.text(425, 195, "reject, or the delivery", css="small")
    canvas.text(425, 209, "count reaches max attempts", css="small")
    canvas.line(530, 275, 658, 275, stroke=AMBER, arrow=True)
    canvas.text(594, 268, "write acknowledged", css="small", anchor="middle")
    canvas.lines(30, 345, [
        "Many members read one partition; the group coordinator keeps each record's state, delivery count and lock,",
        "stored before a member hears of a change (a coordinator restart voids locks, never counts or answers).",
        "railmq consume TOPIC --share-group G --handler mod:fn --visibility-timeout 30s --max-attempts 5",
    ], css="small", step=16)
    return canvas.render()


def data_path() -> str:
    canvas = Canvas(900, 470, "The data path: ZeroMQ sockets and shared-memory rings",
                    "A producer sends batches to the leader over ZeroMQ; followers on the same host fetch through "
                    "shared-memory rings, others and consumers over ZeroMQ; control traffic goes to the coordinators.")
    canvas.text(20, 30, "The data path: one batch, validated once, stored and fetched as the same bytes", css="title")
    canvas.box(20, 70, 200, 120, "producer", ["user thread: send() appends to", "a bounded open batch",
                                              "I/O thread: seals it, one", "msgspec encode + CRC-32"], fill=PALE)
    canvas.box(330, 60, 240, 150, "leader replica (node 1)", ["ROUTER socket; checks header,", "CRC and records once,",
                                                              "stamps base offset + epoch,", "pwritev to the segment",
                                                              "(page cache; fsync by policy)"],
               fill=BLUE_PALE, stroke=BLUE)
    canvas.box(680, 50, 200, 95, "follower (node 2)", ["same host: fetches through", "a shared-memory ring,",
                                                       "appends the same bytes"], fill=PURPLE_PALE, stroke=PURPLE)
    canvas.box(680, 165, 200, 80, "follower (node 3)", ["no ring (another host, or a", "full ring): ZeroMQ frames"],
               fill=PALE)
    canvas.box(330, 290, 240, 90, "consumer", ["fetches over ZeroMQ (a ring with", "shared_memory=True); poll()",
                                               "checks CRCs, decodes per batch"], fill=GREEN_PALE, stroke=GREEN)
    canvas.box(20, 290, 200, 90, "coordinators", ["metadata, elections, ISR;", "groups and offsets"],
               fill=AMBER_PALE, stroke=AMBER, dash=True)
    canvas.line(220, 120, 328, 120, stroke=BLUE, width=2, arrow=True)
    canvas.text(274, 110, "ProduceRequest", css="small", anchor="middle")
    canvas.text(274, 136, "+ batch frame", css="small", anchor="middle")
    canvas.line(570, 95, 678, 95, stroke=PURPLE, width=3, arrow=True)
    canvas.text(624, 84, "ring: bulk bytes", css="small", anchor="middle")
    canvas.line(678, 120, 572, 120, stroke=MUTED, dash=True, arrow=True)
    canvas.text(624, 134, "FetchRequest", css="small", anchor="middle")
    canvas.line(570, 190, 678, 200, stroke=BLUE, width=2, arrow=True)
    canvas.text(624, 215, "FetchResponse", css="small", anchor="middle")
    canvas.line(450, 210, 450, 288, stroke=GREEN, width=2, arrow=True)
    canvas.text(460, 255, "FetchResponse + records frame", css="small")
    canvas.line(120, 288, 120, 192, stroke=AMBER, dash=True, arrow=True)
    canvas.text(130, 245, "metadata: who leads", css="small")
    canvas.line(222, 320, 328, 180, stroke=AMBER, dash=True)
    canvas.text(250, 300, "heartbeats, ISR", css="small")
    canvas.lines(20, 410, [
        "Solid: data. Dashed: control. The broker never loops over records in Python: a batch is checked once",
        "(header, CRC, that the payload holds the records it claims) and written as it came; followers and consumers",
        "get the same bytes. Rings carry bulk bytes between processes on one host; ZeroMQ carries everything else.",
    ], css="small", step=16)
    return canvas.render()
