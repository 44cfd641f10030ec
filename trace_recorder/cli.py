"""`flexfl traces ...`: make the calibrated paper set, show a set's statistics, validate a set."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from flexfl.errors import TraceFormatError
from trace_recorder.calibrate import PAPER_TABLE2, generate_paper_traces, paper_manifest
from trace_recorder.format import Trace, TraceSet, read_trace_set, write_trace_set

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `traces` and its subcommands to the top-level `flexfl` parser."""
    parser = sub.add_parser("traces", help="trace sets: calibrate, show, validate",
                            description="Trace sets: per-round fractions of required updates submitted.")
    actions = parser.add_subparsers(dest="traces_command", required=True, metavar="ACTION")

    cal = actions.add_parser("calibrate", help="generate the set calibrated to the paper's Table 2",
                             description="Generate traces calibrated to the paper's Table 2 statistics "
                                         "(not recorded on devices) and write them as a trace set.")
    cal.add_argument("--out", type=Path, default=Path("traces/paper"), help="set folder (default: traces/paper)")
    cal.add_argument("--rounds", type=int, default=300, help="rounds per trace (default: 300)")
    cal.add_argument("--resolution", type=int, default=20, help="fractions lie on k/RESOLUTION (default: 20)")
    cal.add_argument("--seed", type=int, default=0, help="base seed of the fit (default: 0)")
    cal.set_defaults(func=_calibrate)

    show = actions.add_parser("show", help="print a set's per-trace statistics")
    show.add_argument("path", type=Path, metavar="PATH", help="trace-set folder")
    show.set_defaults(func=_show)

    val = actions.add_parser("validate", help="check a set; exit 2 with file:line: field on error")
    val.add_argument("path", type=Path, metavar="PATH", help="trace-set folder")
    val.set_defaults(func=_validate)


def _calibrate(args: argparse.Namespace) -> int:
    # The canonical command, not sys.argv: the manifest then says how to remake the set
    # however this handler was reached (shell, Makefile, test).
    command = shlex.join(["flexfl", "traces", "calibrate", "--out", str(args.out), "--rounds", str(args.rounds),
                          "--resolution", str(args.resolution), "--seed", str(args.seed)])
    traces = generate_paper_traces(rounds=args.rounds, resolution=args.resolution, seed=args.seed)
    manifest = paper_manifest(rounds=args.rounds, resolution=args.resolution, seed=args.seed, command=command)
    write_trace_set(args.out, manifest, traces)
    print(_table(traces, manifest.conditions))
    worst = max(max(abs(t.mean_pct - PAPER_TABLE2[t.name][0]), abs(t.std_pct - PAPER_TABLE2[t.name][1]))
                for t in traces)
    print(f"wrote {len(traces)} calibrated traces x {args.rounds} rounds to {args.out} "
          f"(largest gap to Table 2: {worst:.3f} pp)")
    return 0


def _show(args: argparse.Namespace) -> int:
    trace_set = read_trace_set(args.path)
    m = trace_set.manifest
    deadline = f"deadline {m.deadline_s:g} s" if m.deadline_s is not None else "no deadline"
    print(f"{m.name} ({m.kind}, schema {m.schema_version}, E = {m.required_updates}, {deadline}, "
          f"created {m.created})")
    print(_table(trace_set.traces, m.conditions))
    return 0


def _validate(args: argparse.Namespace) -> int:
    try:
        trace_set: TraceSet = read_trace_set(args.path)
    except TraceFormatError as exc:
        print(exc, file=sys.stderr)
        return 2
    lengths = sorted({len(t) for t in trace_set.traces})
    rounds = str(lengths[0]) if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}"
    print(f"ok: {len(trace_set.traces)} traces, {rounds} rounds")
    return 0


def _table(traces: tuple[Trace, ...] | list[Trace], conditions: dict) -> str:
    """Per-trace statistics, with the paper's Table 2 values beside traces of the same name."""
    rows = [("trace", "rounds", "mean%", "std%", "zero share", "paper mean%", "paper std%", "condition")]
    for t in traces:
        paper = PAPER_TABLE2.get(t.name)
        cond = conditions.get(t.name, {})
        rows.append((
            t.name, str(len(t)), f"{t.mean_pct:.2f}", f"{t.std_pct:.2f}", f"{t.zero_share:.3f}",
            f"{paper[0]:.1f}" if paper else "-", f"{paper[1]:.1f}" if paper else "-",
            " ".join(f"{k}={v}" for k, v in cond.items()) or "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    # Left-align names and conditions, right-align the numbers between them.
    return "\n".join(
        "  ".join(cell.ljust(w) if i in (0, len(row) - 1) else cell.rjust(w)
                  for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    )
