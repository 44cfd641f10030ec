"""`flexfl traces ...`: make the calibrated paper set, record a set on a fleet or from a run, show or validate a set."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path

from flexfl.app import timeline_cli
from trace_recorder import DEFAULT_PROFILE
from trace_recorder.calibrate import PAPER_TABLE2, generate_paper_traces, paper_manifest
from trace_recorder.format import Trace, TraceSet, read_trace_set, write_trace_set

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `traces` and its subcommands to the top-level `flexfl` parser."""
    parser = sub.add_parser("traces",
                            help="trace sets: calibrate, record, show, validate; device timelines: import, check",
                            description="Trace sets (per round, the fraction of required updates submitted) and "
                                        "device timelines (per device, its conditions over time).")
    actions = parser.add_subparsers(dest="traces_command", required=True, metavar="ACTION")
    _register_calibrate(actions)
    _register_record(actions)
    _register_fidelity(actions)
    _register_from_run(actions)
    _register_inspect(actions)
    timeline_cli.register(actions)  # import-fedscale, import-flash, timeline


def _register_calibrate(actions: argparse._SubParsersAction) -> None:
    """`traces calibrate`: the set calibrated to the paper's Table 2."""
    cal = actions.add_parser("calibrate", help="generate the set calibrated to the paper's Table 2",
                             description="Generate traces calibrated to the paper's Table 2 statistics "
                                         "(not recorded on devices) and write them as a trace set.")
    cal.add_argument("--out", type=Path, default=Path("traces/paper"), help="set folder (default: traces/paper)")
    cal.add_argument("--rounds", type=int, default=300, help="rounds per trace (default: 300)")
    cal.add_argument("--resolution", type=int, default=20, help="fractions lie on k/RESOLUTION (default: 20)")
    cal.add_argument("--seed", type=int, default=0, help="base seed of the fit (default: 0)")
    cal.set_defaults(func=_calibrate)


def _register_record(actions: argparse._SubParsersAction) -> None:
    """`traces record`: a set recorded on an emulated fleet or real hosts."""
    rec = actions.add_parser(
        "record", help="record a set on an emulated fleet (root) or real hosts (--inventory)",
        description="Run the paper's protocol (CPU competitor / upload bandwidth per device, calibrated "
                    "deadline, FedAvg rounds through the real coordinator and agents) and write a trace set. "
                    "Without --inventory it builds an emulated fleet on this machine and needs root.")
    rec.add_argument("--out", type=Path, required=True, help="trace-set folder to write, e.g. traces/recorded-emulated")
    rec.add_argument("--profile", type=Path, default=DEFAULT_PROFILE,
                     help="recording profile (default: trace_recorder/paper_profile.toml)")
    rec.add_argument("--rounds", type=int, help="rounds to record (default: the profile's)")
    rec.add_argument("--traces", help="comma-separated subset of the profile's traces, e.g. T0,T90")
    rec.add_argument("--deadline-s", type=float, help="use this deadline instead of calibrating one")
    rec.add_argument("--inventory", type=Path, help="TOML list of real hosts (see traces/README.md); "
                                                    "their agents and loadgen daemons must already run")
    rec.add_argument("--work", type=Path, help="work folder (default: out/traces-record/<set name>)")
    rec.add_argument("--resume", action="store_true", help="continue the interrupted recording in the work folder")
    rec.add_argument("--overwrite", action="store_true", help="replace a trace set already at --out")
    rec.add_argument("--prefix", default="ffrec", help="emulated fleet's name prefix (default ffrec)")
    rec.add_argument("--subnet", default="10.77.0", help="emulated fleet's /24, first three octets (default 10.77.0)")
    rec.add_argument("--port", type=int, default=50061, help="coordinator port (emulated fleet; default 50061)")
    rec.set_defaults(func=_record)


def _register_fidelity(actions: argparse._SubParsersAction) -> None:
    """`traces fidelity`: record, run live under the same loads, compare."""
    fid = actions.add_parser(
        "fidelity", help="do recorded traces predict live FL? record, run live under the same loads, compare (root)",
        description="On an emulated fleet (root): record a trace set under the profile's loads (as `traces record`), "
                    "run live FL in deadline mode under the same loads, deadline and E, and compare per device the "
                    "live s/E with the recorded trace (KS distance, mean difference) and the live accuracy and loss "
                    "with simulations replaying the traces over several seeds. Phases are saved in --work; a rerun "
                    "skips finished ones. Writes the page, two CSVs and two plots.")
    fid.add_argument("--quick", action="store_true",
                     help="a few-minute run: traces T0,T90, 8 recorded and 8 live rounds, 3 simulations, 4 warm-up "
                          "rounds (flags still override); default --work out/trace-fidelity-quick, page in it")
    fid.add_argument("--profile", type=Path, help="recording profile (default: trace_recorder/paper_profile.toml)")
    fid.add_argument("--traces", help="comma-separated traces of the profile, one device each "
                                      "(default T0,T50,T90,Thi,Tlo; 'all': every trace)")
    fid.add_argument("--record-rounds", type=int, help="R rounds recorded per device (default 150)")
    fid.add_argument("--live-rounds", type=int, help="N rounds of live FL, and of each simulation (default 150)")
    fid.add_argument("--seeds", type=int, help="K simulations replaying the traces, at the K seeds after the live "
                                               "run's (default 5)")
    fid.add_argument("--eta0", type=float, help="eta_0 of the FL phase (default: flexfl live's for the dataset)")
    fid.add_argument("--work", type=Path, help="work folder (default out/trace-fidelity)")
    fid.add_argument("--out", type=Path, help="the page (default results/trace_fidelity.md); CSVs and PNGs beside it")
    fid.add_argument("--prefix", default="fffid", help="emulated fleet's name prefix (default fffid)")
    fid.add_argument("--subnet", default="10.77.4", help="emulated fleet's /24, first three octets (default 10.77.4)")
    fid.add_argument("--port", type=int, default=50062, help="coordinator port (default 50062)")
    fid.set_defaults(func=_fidelity)


def _register_from_run(actions: argparse._SubParsersAction) -> None:
    """`traces from-run`: a set from a run folder whose rows carry live measurements (FlexFL live, Flower)."""
    conv = actions.add_parser(
        "from-run", help="a set from a live or Flower run folder: per device, what it did each round",
        description="Write a recorded trace set from a run folder whose rows carry live measurements: a FlexFL "
                    "live run's (flexfl live, a coordinator's output) or a Flower run's (FlexFL's strategy in "
                    "Flower, written by coordinator.flower_run). One trace per device, named by its device id "
                    "(node-<id> in Flower): per round, s / E, train_s, upload_s (0 in a Flower run: not measured), "
                    "upload_bytes, arrived and stop_reason (fleet.proto's number), with E and the deadline from "
                    "run.json. A device's trace holds only the rounds it was asked to train in (none before it "
                    "arrived or after it left). See traces/README.md.")
    conv.add_argument("run", type=Path, metavar="RUN_FOLDER",
                      help="the run folder (run.json with metrics.jsonl or coordinator/metrics.jsonl)")
    conv.add_argument("--out", type=Path, required=True, help="trace-set folder to write")
    conv.add_argument("--name", help="the set's name (default: the --out folder's name)")
    conv.set_defaults(func=_from_run)


def _register_inspect(actions: argparse._SubParsersAction) -> None:
    """`traces show` and `traces validate`: read a set that exists."""
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


def _record(args: argparse.Namespace) -> int:
    from trace_recorder.recording.recorder import RecordOptions, default_command, record

    argv = ["--out", str(args.out)]
    for flag in ("profile", "rounds", "traces", "deadline_s", "inventory", "work", "prefix", "subnet", "port"):
        value = getattr(args, flag)
        if value is not None and not (flag == "profile" and value == DEFAULT_PROFILE):
            argv += [f"--{flag.replace('_', '-')}", str(value)]
    opts = RecordOptions(
        out=args.out, profile=args.profile, rounds=args.rounds,
        traces=tuple(t for t in (args.traces or "").split(",") if t), work=args.work, resume=args.resume,
        overwrite=args.overwrite, deadline_s=args.deadline_s, inventory=args.inventory, prefix=args.prefix,
        subnet=args.subnet, port=args.port, command=default_command(argv),
    )
    result = record(opts)
    m = result["manifest"]
    print(_table(result["traces"], m.conditions))
    print(f"wrote {len(m.traces)} recorded traces x {len(result['traces'][0])} rounds to {args.out} "
          f"(deadline {m.deadline_s:g} s, E = {m.required_updates}) in {result['elapsed_s']:.0f} s")
    return 0


def _fidelity(args: argparse.Namespace) -> int:
    from trace_recorder.fidelity.experiment import (
        QUICK,
        FidelityConfig,
        FidelityOptions,
        FleetPlace,
        default_command,
        run_fidelity,
    )

    given = {"profile": args.profile and str(args.profile), "record_rounds": args.record_rounds,
             "live_rounds": args.live_rounds, "sim_seeds": args.seeds, "eta0": args.eta0}
    if args.traces:
        given["traces"] = () if args.traces == "all" else tuple(t for t in args.traces.split(",") if t)
    fields = {**(QUICK if args.quick else {}), **{k: v for k, v in given.items() if v is not None}}
    work = args.work or Path("out/trace-fidelity-quick" if args.quick else "out/trace-fidelity")
    argv = [*(["--quick"] if args.quick else []),
            *[x for flag in ("profile", "traces", "record_rounds", "live_rounds", "seeds", "eta0", "work", "out")
              if getattr(args, flag) is not None for x in (f"--{flag.replace('_', '-')}", str(getattr(args, flag)))]]
    opts = FidelityOptions(config=FidelityConfig(**fields), work=work,
                           page=args.out or (work / "trace_fidelity.md" if args.quick
                                             else Path("results/trace_fidelity.md")),
                           fleet=FleetPlace(prefix=args.prefix, subnet=args.subnet, port=args.port),
                           command=default_command(argv))
    result = run_fidelity(opts)
    devs, curves = result["devices"], result["curves"]
    acc = next(c for c in curves if c.metric == "test_acc")
    print("KS distance of s/E, live vs recorded: " + ", ".join(f"{d.device} {d.ks:.3f}" for d in devs)
          + f"; live accuracy inside the simulated band in {100 * acc.inside_share:.0f} % of rounds; "
          f"page {result['files']['page']}")
    return 0


def _from_run(args: argparse.Namespace) -> int:
    from flexfl.app.run_traces import default_command, run_trace_set

    name = args.name or args.out.resolve().name
    manifest, traces = run_trace_set(args.run, name=name, command=default_command(args.run, args.out, args.name))
    write_trace_set(args.out, manifest, traces)
    print(_table(traces, manifest.conditions))
    deadline = f"deadline {manifest.deadline_s:g} s" if manifest.deadline_s is not None else "no deadline"
    print(f"wrote {len(traces)} traces ({manifest.source['rounds']['count']} rounds, {deadline}, "
          f"E = {manifest.required_updates}) from {args.run} to {args.out}")
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
    trace_set: TraceSet = read_trace_set(args.path)  # a TraceFormatError: one `flexfl: error:` line, exit 2
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
