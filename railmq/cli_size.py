"""`railmq size`: the design articles' capacity arithmetic, from your inputs or theirs.

    railmq size                                   the articles' worked example, figure by figure
    railmq size --peak 120000 --message-bytes 400 your own workload
    railmq size --daily-messages 2e9 --peak-factor 4
    railmq size --json                            every quantity, with its formula and the articles' value

The arithmetic is railmq/sizing.py (pure) and its wording railmq/sizing_text.py. The duplicates
figures are also *run*: chaos/labs/duplicates_sim.py drives railmq's consumer-group state
machines in the simulator, crashing the consumer between processing and commit, and counts the
messages processed twice (`--simulate-messages 0` skips it). Like every cli_* module this one
hangs under the roof (railmq/cli.py), so it may import chaos; railmq/sizing.py may not.
"""

from __future__ import annotations

import argparse
import json
import sys

import msgspec

from railmq.cli_common import EXIT_OK, UsageError, non_negative_int, positive_float, positive_int
from railmq.sizing import SimulatedDuplicates, SizingError, SizingInputs, report_dict, size
from railmq.sizing_text import backlog_lines, capacity_lines, duplicates_lines, hot_lines, remap_lines

# Messages simulated per commit policy by default: ~1,000 crashes at 1% (a 3% spread on the
# per-message figure) in about ten seconds on a 2-core machine; scaled to --duplicates-messages.
SIMULATED_MESSAGES_DEFAULT = 100_000
SIMULATED_MESSAGES_MAX = 10_000_000


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"a probability in [0, 1) is needed, got {text!r}")
    return value


def consumer_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not counts or any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError(f"consumer counts are positive integers, got {text!r}")
    return counts


def register(commands: argparse._SubParsersAction) -> None:
    defaults = SizingInputs()
    parser = commands.add_parser(
        "size", help="capacity arithmetic: bandwidth, storage, partitions, consumers, hot keys, backlog",
        description="The articles' sizing arithmetic, each quantity with its formula; with no arguments "
                    "their worked example (50,000 msg/s, 1,000 B, 7 days, 3 copies).")
    rate = parser.add_argument_group("rate (a peak, or a daily volume and a peak factor)")
    rate.add_argument("--peak", type=positive_float, metavar="MSG_PER_S",
                      help=f"peak messages per second (default {defaults.peak_messages_per_s:,.0f})")
    rate.add_argument("--daily-messages", type=positive_float, metavar="N",
                      help="messages per day; the peak is this / 86,400 × --peak-factor")
    rate.add_argument("--peak-factor", type=positive_float, default=None, metavar="F",
                      help="peak over average, with --daily-messages (the articles suggest 3 to 5)")
    add = parser.add_argument
    add("--message-bytes", type=positive_float, default=defaults.message_bytes, metavar="B",
        help="bytes per message, key and headers included (default 1,000)")
    add("--retention-days", type=positive_float, default=defaults.retention_days, metavar="D",
        help="days each message is kept (default 7)")
    add("--replication-factor", type=positive_int, default=defaults.replication_factor, metavar="N",
        help="copies of every message kept (default 3)")
    add("--partition-mb-per-s", type=positive_float, default=defaults.partition_mb_per_s, metavar="MB",
        help="what one partition sustains (default 5)")
    add("--consumer-rate", type=positive_float, default=defaults.consumer_messages_per_s, metavar="MSG_PER_S",
        help="messages per second one consumer processes (default 2,500)")
    add("--headroom", type=positive_float, default=defaults.headroom, metavar="X",
        help="partitions beyond the minimum, as a factor (default 2)")
    add("--keys", type=positive_int, default=defaults.keys, metavar="N",
        help="user keys with traffic ∝ 1/rank, for the hot partition (default 1,000)")
    add("--outage-minutes", type=positive_float, default=defaults.outage_minutes, metavar="MIN",
        help="how long consumers are down before the backlog drains (default 10)")
    add("--drain-consumers", type=consumer_counts, default=defaults.drain_consumers, metavar="N,N,...",
        help="consumer counts to drain the backlog with (default 20,25,30,40)")
    add("--partitions-from", type=positive_int, default=defaults.partitions_from, metavar="N",
        help="partition count before a change, for the keys remapped (default 20)")
    add("--partitions-to", type=positive_int, default=defaults.partitions_to, metavar="N",
        help="partition count after the change (default 30)")
    add("--crash-probability", type=probability, default=defaults.crash_probability, metavar="P",
        help="chance of a crash between processing a message and committing it (default 0.01)")
    add("--commit-batch", type=positive_int, default=defaults.commit_batch_messages, metavar="B",
        help="messages per commit for the per-batch figure (default 100)")
    add("--duplicates-messages", type=positive_int, default=defaults.duplicates_messages, metavar="N",
        help="the duplicates are counted per this many messages (default 1,000,000)")
    add("--simulate-messages", type=non_negative_int, default=SIMULATED_MESSAGES_DEFAULT, metavar="N",
        help="messages to run through the simulated consumer per policy (default "
             f"{SIMULATED_MESSAGES_DEFAULT:,}; 0 skips the simulation)")
    add("--seed", type=int, default=1, help="the simulation's seed (default 1)")
    add("--json", action="store_true", help="print every figure as one JSON object")
    parser.set_defaults(handler=run_size, parser=parser)


def inputs_from(args: argparse.Namespace) -> SizingInputs:
    if args.peak is not None and args.daily_messages is not None:
        raise UsageError(args.parser, "give --peak or --daily-messages, not both")
    if args.peak_factor is not None and args.daily_messages is None:
        raise UsageError(args.parser, "--peak-factor goes with --daily-messages")
    if args.simulate_messages > SIMULATED_MESSAGES_MAX:
        raise UsageError(args.parser, f"--simulate-messages is at most {SIMULATED_MESSAGES_MAX:,}")
    peak = None if args.daily_messages is not None else (args.peak or SizingInputs().peak_messages_per_s)
    try:
        return SizingInputs(
            peak_messages_per_s=peak, daily_messages=args.daily_messages, peak_factor=args.peak_factor or 1.0,
            message_bytes=args.message_bytes, retention_days=args.retention_days,
            replication_factor=args.replication_factor, partition_mb_per_s=args.partition_mb_per_s,
            consumer_messages_per_s=args.consumer_rate, headroom=args.headroom, keys=args.keys,
            outage_minutes=args.outage_minutes, drain_consumers=args.drain_consumers,
            partitions_from=args.partitions_from, partitions_to=args.partitions_to,
            crash_probability=args.crash_probability, commit_batch_messages=args.commit_batch,
            duplicates_messages=args.duplicates_messages)
    except SizingError as error:
        raise UsageError(args.parser, str(error)) from None


def simulate(inputs: SizingInputs, messages: int, seed: int) -> list[SimulatedDuplicates]:
    """Both commit policies on the simulated consumer, `messages` each, scaled to the inputs'."""
    from chaos.labs.duplicates_sim import DuplicatesConfig, SimulationStuck, simulate_duplicates

    runs = []
    for commit_every in (1, inputs.commit_batch_messages):
        try:
            result = simulate_duplicates(DuplicatesConfig(messages=messages,
                                                          crash_probability=inputs.crash_probability,
                                                          commit_every=commit_every, seed=seed))
        except SimulationStuck as stuck:  # a batch of 40 at p = 0.5 commits once in 10^12 tries
            raise SizingError(f"the simulated consumer could not commit batches of {commit_every:,} with a "
                              f"crash chance of {inputs.crash_probability:g} ({stuck}): lower --commit-batch "
                              "or --crash-probability, or skip it with --simulate-messages 0") from None
        runs.append(SimulatedDuplicates(commit_every=commit_every, messages_simulated=messages,
                                        processings=result.processings, crashes=result.crashes,
                                        scaled_to=inputs.duplicates_messages))
    return runs


def run_size(args: argparse.Namespace) -> int:
    try:
        return _run_size(args)
    except SizingError as error:
        raise UsageError(args.parser, str(error)) from None


def _run_size(args: argparse.Namespace) -> int:
    inputs = inputs_from(args)
    report = size(inputs)
    if args.json:
        simulated = simulate(inputs, args.simulate_messages, args.seed) if args.simulate_messages else []
        out = report_dict(report)
        out["simulated_duplicates"] = [dict(msgspec.to_builtins(run), duplicates=run.duplicates,
                                            scaled_duplicates=run.scaled_duplicates) for run in simulated]
        print(json.dumps(out, indent=2))
        return EXIT_OK
    write = sys.stdout.write
    for section in (capacity_lines(report), hot_lines(report)):
        write("\n".join(section) + "\n\n")
    sys.stdout.flush()  # the arithmetic is instant; the simulation below takes a few seconds
    simulated = simulate(inputs, args.simulate_messages, args.seed) if args.simulate_messages else []
    for section in (duplicates_lines(report, simulated), backlog_lines(report), remap_lines(report)):
        write("\n".join(section) + "\n\n")
    return EXIT_OK
