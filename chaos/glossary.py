"""What each word of a chaos report means: the anomaly kinds and measures, in one place.

The HTML report prints all of it under "Glossary"; the terminal summary prints the entries of
the anomalies a run actually found. The words follow chaos/checker.py's rules (docs/history.md).
"""

from __future__ import annotations

# (term as the summary shows it, what it means, why it matters)
GLOSSARY: list[tuple[str, str]] = [
    ("acknowledged", "sends the cluster answered with success (acks as the scenario sets them)."),
    ("failed", "sends answered with an error: the producer was told they were not written."),
    ("indeterminate", "sends with no answer (a timeout, a dead connection): they may or may not be in the log; "
                      "never counted as lost."),
    ("lost", "acknowledged sends missing from the final read of their partition (or found at another offset). "
             "A violation unless the scenario expects loss (acks=1, unclean election)."),
    ("phantom", "values read that no send ever invoked: the log made something up."),
    ("failed read", "values read whose send was answered with an error: a write reported as failed took effect."),
    ("inconsistent offsets", "two values seen at one offset, or one value at two offsets, across acknowledgements, "
                             "polls and final reads."),
    ("order violations", "for one key, a send acknowledged before another was invoked, yet stored after it."),
    ("poll violations", "within one member's generation, polled offsets of a partition that went backwards or "
                        "skipped one."),
    ("commit regressions", "a group's committed offset that moved back after a later commit completed."),
    ("divergences", "two replicas holding different records below both their high watermarks."),
    ("unchecked", "acknowledged sends on a partition the final read could not read to its end: nothing "
                  "shows they survived, so the run cannot pass."),
    ("unseen", "acknowledged values the consumer group never polled, after the recovery window."),
    ("duplicates", "deliveries of a value beyond its first (at-least-once allows them; the rate is reported, "
                   "never a violation)."),
    ("failover", "from a fault that took a leader away to the next acknowledged send on that partition; the "
                 "stricter figure counts only sends invoked after the fault."),
    ("leftover processes / shm", "processes or /dev/shm segments still there after the run: a cleanup bug."),
]

# Summary measures and the glossary entry that explains each, for printing only what a run found.
ENTRY_OF_MEASURE = {
    "lost": "lost", "unchecked": "unchecked", "phantom": "phantom", "failed_reads": "failed read",
    "inconsistent_offsets": "inconsistent offsets",
    "order_violations": "order violations", "poll_violations": "poll violations",
    "commit_regressions": "commit regressions", "divergences": "divergences", "unseen": "unseen",
    "duplicates": "duplicates", "indeterminate_sends": "indeterminate",
}


def entries_for(counts: dict[str, int]) -> list[tuple[str, str]]:
    """The glossary entries of the measures that are not zero, in glossary order."""
    wanted = {ENTRY_OF_MEASURE[name] for name, count in counts.items() if count and name in ENTRY_OF_MEASURE}
    return [(term, words) for term, words in GLOSSARY if term in wanted]
