"""`flexfl traces import-fedscale | import-flash | timeline`: make device timelines from public traces, check one."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from trace_recorder.availability import FEDSCALE_TRAINING_FACTOR


def register(actions: argparse._SubParsersAction) -> None:
    """Add the timeline subcommands to `flexfl traces`."""
    fed = actions.add_parser(
        "import-fedscale", help="make a device timeline from FedScale's client_device_capacity and client_behave_trace",
        description="Convert FedScale's device traces (pickled dicts, read with a restricted unpickler that admits "
                    "only plain data) into a timeline CSV: per device its CPU share, link rates and availability "
                    "over time (traces/README.md, 'Device timelines').")
    fed.add_argument("--capacity", type=Path, required=True, help="FedScale's client_device_capacity file")
    fed.add_argument("--behave", type=Path,
                     help="FedScale's client_behave_trace file (without it every device is always online)")
    _add_common_flags(fed)
    fed.set_defaults(func=_import_fedscale)

    flash = actions.add_parser(
        "import-flash", help="make a device timeline from FLASH-style state logs (availability only)",
        description="Convert FLASH-style device state logs (a JSON object of device id -> {'messages': "
                    "'<time>\\t<state>' lines}) into a timeline CSV; a device is available while its screen is "
                    "locked, it charges and it is on WiFi. Compute and links come from a FedScale capacity file "
                    "or from constant values.")
    flash.add_argument("--states", type=Path, required=True, help="the state-log JSON file (FLASH: state_traces.json)")
    flash.add_argument("--capacity", type=Path, help="FedScale's client_device_capacity for compute and links")
    flash.add_argument("--up-kbit-s", type=float, help="without --capacity: every device's upload rate, kbit/s")
    flash.add_argument("--down-kbit-s", type=float,
                       help="without --capacity: download rate, kbit/s (default: the upload's)")
    flash.add_argument("--cpu-share", type=float, help="without --capacity: every device's CPU share (default 1)")
    _add_common_flags(flash)
    flash.set_defaults(func=_import_flash)

    show = actions.add_parser("timeline", help="check a timeline file and print what it holds",
                              description="Read a timeline CSV (every field checked; exit 2 with file:line: field on "
                                          "error) and print its devices, span and online share.")
    show.add_argument("path", type=Path, metavar="FILE", help="timeline CSV")
    show.set_defaults(func=_show)


def _add_common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="timeline CSV to write (replaced if it exists)")
    p.add_argument("--devices", type=int, help="how many devices to draw (default: all the input has)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    p.add_argument("--horizon-s", type=float, default=3600.0,
                   help="run seconds the timeline covers, from 0 (default 3600; a trace repeats when it ends)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="trace seconds per run second (default 1; 3600 plays an hour of the trace each second)")
    p.add_argument("--start-s", type=float, default=0.0, help="trace second that run second 0 reads (default 0)")
    p.add_argument("--model-cost-ratio", type=float, default=FEDSCALE_TRAINING_FACTOR,
                   help="the run's training ms per sample over the trace's ms per sample (default "
                        f"{FEDSCALE_TRAINING_FACTOR:g}: FedScale's own factor from its inference latencies "
                        "to training)")
    p.add_argument("--reference-ms-per-sample", type=float,
                   help="the run's training ms per sample at cpu_share 1 (default: the fastest imported device's, "
                        "which gets cpu_share 1)")


def _scaling_and_clock(args: argparse.Namespace):
    from trace_recorder.availability import ComputeScaling, TraceClock

    return (ComputeScaling(model_cost_ratio=args.model_cost_ratio,
                           reference_ms_per_sample=args.reference_ms_per_sample),
            TraceClock(horizon_s=args.horizon_s, time_scale=args.time_scale, start_s=args.start_s))


def _import_fedscale(args: argparse.Namespace) -> int:
    from trace_recorder.importers.fedscale import import_fedscale

    scaling, clock = _scaling_and_clock(args)
    result = import_fedscale(args.capacity, args.behave, devices=args.devices, seed=args.seed, scaling=scaling,
                             clock=clock)
    argv = ["--capacity", str(args.capacity), *(["--behave", str(args.behave)] if args.behave else [])]
    _write(args, result, command="import-fedscale", argv=argv)
    return 0


def _import_flash(args: argparse.Namespace) -> int:
    from trace_recorder.availability import DeviceSpec
    from trace_recorder.importers.flash import import_flash

    scaling, clock = _scaling_and_clock(args)
    constant = None
    argv = ["--states", str(args.states)]
    if args.capacity is not None:
        argv += ["--capacity", str(args.capacity)]
    if args.up_kbit_s is not None or args.down_kbit_s is not None or args.cpu_share is not None:
        from flexfl.errors import ConfigError

        if args.capacity is not None:
            raise ConfigError("--capacity gives compute and links: drop --up-kbit-s / --down-kbit-s / --cpu-share")
        if args.up_kbit_s is None:
            raise ConfigError("--down-kbit-s and --cpu-share need --up-kbit-s too")
        down = args.down_kbit_s if args.down_kbit_s is not None else args.up_kbit_s
        share = args.cpu_share if args.cpu_share is not None else 1.0
        for flag, value, low in (("--up-kbit-s", args.up_kbit_s, 0.0), ("--down-kbit-s", down, 0.0),
                                 ("--cpu-share", share, 0.0)):
            if not low < value < float("inf") or (flag == "--cpu-share" and value > 1):
                raise ConfigError(f"{flag} must be a finite number > 0{' and <= 1' if flag == '--cpu-share' else ''}, "
                                  f"got {value}")
        constant = DeviceSpec(cpu_share=share, up_kbit_s=args.up_kbit_s, down_kbit_s=down)
        argv += ["--up-kbit-s", f"{args.up_kbit_s:g}", "--down-kbit-s", f"{down:g}", "--cpu-share", f"{share:g}"]
    result = import_flash(args.states, devices=args.devices, seed=args.seed, capacity_path=args.capacity,
                          constant=constant, scaling=scaling, clock=clock)
    _write(args, result, command="import-flash", argv=argv)
    return 0


def _write(args: argparse.Namespace, result, *, command: str, argv: list[str]) -> None:
    from trace_recorder.timeline import write_timeline

    # The canonical command, so that the file says how to remake it however it was reached.
    argv += ["--out", str(args.out), "--seed", str(args.seed), "--horizon-s", f"{args.horizon_s:g}",
             "--time-scale", f"{args.time_scale:g}", "--start-s", f"{args.start_s:g}",
             "--model-cost-ratio", f"{args.model_cost_ratio:g}"]
    if args.devices is not None:
        argv += ["--devices", str(args.devices)]
    if args.reference_ms_per_sample is not None:
        argv += ["--reference-ms-per-sample", f"{args.reference_ms_per_sample:g}"]
    reference = result.reference_ms_per_sample
    comments = [shlex.join(["flexfl", "traces", command, *argv]),
                (f"cpu_share 1.0 = {reference!r} ms per training sample of the run's model (simulate with --sample-s "
                 f"{reference / 1000!r})") if reference is not None else "cpu_share as given (not scaled from a trace)",
                *(f"{device}: {source}" for device, source in result.sources.items())]
    write_timeline(args.out, result.timeline, comments=comments)
    t = result.timeline
    rows = sum(len(r) for r in t.devices.values())
    print(_summary(t))
    if result.skipped:
        print(f"left out {len(result.skipped)} device logs that cannot be read; the first: {result.skipped[0]}")
    if result.capped:
        print(f"{result.capped} devices are faster than the reference ({reference:g} ms/sample) and got cpu_share 1")
    cost = f"--sample-s {reference / 1000:g}" if reference is not None else "--update-s SECONDS"
    print(f"wrote {len(t.devices)} devices, {rows} intervals to {args.out}; simulate with: flexfl sim run "
          f"--timeline {args.out} --devices {len(t.devices)} --deadline-s SECONDS {cost}")


def _summary(t) -> str:
    """One line per device (the first few) and a total: online share of time, mean cpu_share and rates."""
    lines: list[str] = []
    total_on = total = 0.0
    for name, rows in t.devices.items():
        on = sum(r.end - r.start for r in rows if r.conditions.online)
        span = rows[-1].end - rows[0].start
        total_on, total = total_on + on, total + span
        if len(lines) < 5:
            c = rows[0].conditions
            lines.append(f"  {name}: {len(rows)} intervals over {rows[0].start:g}..{rows[-1].end:g} {t.unit.value}, "
                         f"online {100 * on / span:.1f}%, cpu_share {c.cpu_share:.3g}, up {c.up_kbit_s:g} kbit/s, "
                         f"down {c.down_kbit_s:g} kbit/s (first interval)")
    if len(t.devices) > 5:
        lines.append(f"  ... {len(t.devices) - 5} more")
    head = (f"{len(t.devices)} devices, time in {'seconds' if t.unit.value == 's' else 'rounds'}, "
            f"ends at {t.end:g}, online {100 * total_on / total:.1f}% of device-time")
    return "\n".join([head, *lines])


def _show(args: argparse.Namespace) -> int:
    from trace_recorder.timeline import read_timeline

    print(_summary(read_timeline(args.path)))  # a TraceFormatError: one `flexfl: error:` line, exit 2
    return 0
