"""How to read report.html: the real report timeline, drawn from a fixed made-up run, with each
part numbered and explained."""

from __future__ import annotations

from chaos.report import HEIGHT as TIMELINE_HEIGHT
from chaos.report import WIDTH as TIMELINE_WIDTH
from chaos.report import timeline_svg
from chaos.timeline import Bin, FaultBand, LeaderChange, Second, Timeline
from svg import Canvas

# A 20-second run: ~400 acknowledged writes a second, a leader kill at 6 s (a one-second dip while
# the partition has no leader), a pause of a follower from 12 to 14 s, the heal at 16 s.
RUN_SECONDS = 20
KILL_S, PAUSE_START_S, PAUSE_END_S, HEAL_S = 6.0, 12.0, 14.0, 16.0


def _made_up_run() -> Timeline:
    seconds = []
    for second in range(RUN_SECONDS):
        acknowledged = 120 if second == int(KILL_S) else 410 - (second % 3) * 15
        p99 = 640.0 if second == int(KILL_S) else (38.0 if PAUSE_START_S <= second < PAUSE_END_S else 14.0)
        seconds.append(Second(second, acknowledged, 3.0 + (second % 4) * 0.4, p99))
    bins = []
    for second in range(RUN_SECONDS):  # 100 ms bins within a second before and two after each fault
        fine = int(KILL_S) - 1 <= second < int(KILL_S) + 3 or int(PAUSE_START_S) - 1 <= second < int(PAUSE_END_S) + 2
        if not fine:
            one = seconds[second]
            bins.append(Bin(float(second), 1.0, one.acknowledged, one.latency_ms_p50, one.latency_ms_p99))
            continue
        for slot in range(10):
            start = round(second + slot / 10, 1)
            waiting = KILL_S <= start < KILL_S + 0.5  # no leader: nothing acknowledged
            catching_up = start == KILL_S + 0.5  # the backlog lands at once, late
            slow = PAUSE_START_S <= start < PAUSE_END_S
            acknowledged = 0 if waiting else (85 if catching_up else 41)
            p99 = None if waiting else (560.0 if catching_up else (38.0 if slow else 12.0))
            bins.append(Bin(start, 0.1, acknowledged, None if waiting else 3.2, p99))
    faults = [FaultBand(KILL_S, KILL_S + 0.25, "kill leader replica/chaos/0/n1", True),
              FaultBand(PAUSE_START_S, PAUSE_END_S, "pause follower replica/chaos/1/n3", False)]
    leaders = [LeaderChange(KILL_S + 0.55, "chaos/0 → n2", False)]
    return Timeline(seconds, faults, leaders, HEAL_S, float(RUN_SECONDS), [550.0], bins)


NOTES = [
    ("fault bands", "each fault the nemesis ran, labelled with what and whom; a kill is a thin band"),
    ("throughput", "acknowledged writes per second, in 100 ms bins around faults: the gap is the failover, "
                   "writes waiting for a leader"),
    ("latency", "p50 and p99 acknowledgement latency, log scale: the writes that waited show as a p99 spike"),
    ("elections", "a tick per leader election (red: unclean, data may be lost)"),
    ("heal", "faults end; the recovery window lets the cluster converge before the check"),
    ("below", "the summary table, lost messages and why, failover samples, the glossary"),
]


def reading_the_report() -> str:
    margin, notes_width = 20, 330
    canvas = Canvas(TIMELINE_WIDTH + notes_width + 2 * margin, TIMELINE_HEIGHT + 90,
                    "How to read a chaos report's timeline",
                    "The report timeline of a made-up run with a leader kill and a paused follower, its parts numbered: "
                    "fault bands, throughput, latency, elections, heal.")
    canvas.text(margin, 30, "How to read report.html (railmq chaos run SCENARIO --report DIR)", css="title")
    canvas.embed(margin, 50, timeline_svg(_made_up_run()))
    def at(seconds: float) -> float:  # the x of a time on the embedded timeline
        return margin + 64 + (TIMELINE_WIDTH - 64 - 16) * seconds / RUN_SECONDS

    spots = [(at(KILL_S) - 14, 60), (at(2.5), 150), (margin + 420, 316), (at(KILL_S + 0.55) + 16, 296),
             (at(HEAL_S) + 44, 466), (margin + 10, TIMELINE_HEIGHT + 72)]
    for number, (x, y) in enumerate(spots, start=1):
        canvas.badge(x, y, number)
    canvas.text(margin + 28, TIMELINE_HEIGHT + 76, "below the timeline: the summary, lost messages and why, "
                "failovers, the faults, a glossary", css="small")
    x = margin + TIMELINE_WIDTH + 20
    y = 80
    for number, (name, words) in enumerate(NOTES, start=1):
        canvas.badge(x + 10, y - 4, number)
        canvas.text(x + 28, y, name, css="head")
        y = canvas.lines(x + 28, y + 18, _wrap(words, 42), css="small", step=15) + 14
    return canvas.render()


def _wrap(words: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in words.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + [line] if line else lines
