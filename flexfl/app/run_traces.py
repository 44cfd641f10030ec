"""`flexfl traces from-run`: a trace set from a run folder whose rows carry live measurements.

A FlexFL live run's coordinator rows and a Flower run's rows (coordinator.flower_strategy's records, written by
coordinator.flower_run) both hold a round's live part (coordinator.rules.round_record.LiveRound: bytes, times,
refusals). Such a run becomes a `recorded` set, one trace per device named by its device id, built by the
recorder's own rule (trace_recorder.recording.recorder.build_traces: fraction = s / E, train_s, upload_s,
upload_bytes, arrived, stop_reason); the run folder is read by the report's reader (flexfl.app.report.data).

A device's trace holds the rounds it was asked to train in: those it was a participant of (the round was
opened for it: a member of the objective, and drawn under client sampling), except a round at whose close it
departed without having been sent the model (it was already gone: a Flower node that vanished). Rounds before
it arrived and after it left are absent (a trace's rounds may have gaps), not zeros: the device was not in the
federation then, which is not an inactive round. Its arrival round is not in it either (a Flower node's first
reply gives its sample count only; a FlexFL agent joins between rounds). A device asked in no round has no trace.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, NamedTuple

from coordinator.rules.round_record import RoundRecord
from flexfl import __version__
from flexfl.app.report.data import Run, detect, natural_key, read_run
from flexfl.errors import FlexFLError
from trace_recorder.format import Trace, TraceManifest, utc_now_iso
from trace_recorder.manifest import NAME_RE, NAME_RULE, SCHEMA_VERSION
from trace_recorder.recording.recorder import COLUMNS, build_traces

UPLOAD_NOTE = {
    "flower": "upload_s is 0 throughout: Flower does not show how long a node's upload took",
    "flexfl": "upload_s is what the agent measured and sent in its next update header (0 where that did not arrive)",
}


class RunTracesError(FlexFLError):
    """A folder cannot become a trace set: not a run, no rounds, or rows without live measurements."""


class _Device(NamedTuple):
    device_id: str
    trace: str  # its trace's name: the device id


def asked_rounds(rows: dict[int, RoundRecord], device: str) -> list[int]:
    """The rounds `device` was asked to train in (the module docstring's rule), in order."""
    return [k for k, r in sorted(rows.items()) if device in r.participants
            and not (device in r.departures and r.live is not None and device not in r.live.bytes_out)]


def run_trace_set(run_dir: Path, *, name: str, command: str = "") -> tuple[TraceManifest, list[Trace]]:
    """The trace set of the run in `run_dir` (named `name`); a RunTracesError says why a folder cannot be one."""
    run_dir = Path(run_dir)
    found = detect(run_dir)  # a ReportError names what a run folder holds when it is nothing known
    if found != "run":
        what = {"traces": "a trace set", "sweep": "a sweep", "campaign": "a campaign"}.get(found, found)
        raise RunTracesError(f"{run_dir}: holds {what}, not a run (run.json with metrics.jsonl, as a live or "
                             "Flower run writes it)")
    run = read_run(run_dir)
    if not run.rounds:
        raise RunTracesError(f"{run_dir}: an empty run: no rounds in {', '.join(run.sources)}")
    records = [r.record for r in run.rounds]
    if any(r is None for r in records):
        raise RunTracesError(f"{run_dir}: holds per-round aggregates only ({', '.join(run.sources)}: a simulation's "
                             "summary), not per-device rows with live measurements")
    rows = {r.round: r for r in records if r is not None}  # a round written twice (a resume): the last row
    unmeasured = [k for k, r in sorted(rows.items()) if r.live is None]
    if unmeasured:
        raise RunTracesError(f"{run_dir}: round {unmeasured[0]}'s row holds no live measurements (bytes, times): a "
                             f"simulation's rows ({len(unmeasured)} of {len(rows)} rounds); a trace set comes from a "
                             "live run (flexfl live, a coordinator) or a Flower run (coordinator.flower_run)")
    E = run.required_updates or next((r.E for r in reversed(rows.values()) if r.E is not None), None)
    if E is None:
        raise RunTracesError(f"{run_dir}: E (required updates) is in neither run.json nor the rows' rules")
    devices = sorted({d for r in rows.values() for d in r.participants}, key=natural_key)
    bad = [d for d in devices if not NAME_RE.match(d)]
    if bad:
        raise RunTracesError(f"{run_dir}: device id {bad[0]!r} cannot name a trace ({NAME_RULE})")
    traces = []
    for d in devices:
        asked = asked_rounds(rows, d)
        if asked:
            traces += build_traces(rows, asked, [_Device(device_id=d, trace=d)], E)
    if not traces:
        raise RunTracesError(f"{run_dir}: no device was asked to train in any of its {len(rows)} rounds")
    return _manifest(run, rows, traces, name=name, E=E, command=command), traces


def _manifest(run: Run, rows: dict[int, RoundRecord], traces: list[Trace], *, name: str, E: int,
              command: str) -> TraceManifest:
    engine = "flower" if "flower" in run.config else "flexfl"
    what = "a Flower run (FlexFL's strategy in Flower)" if engine == "flower" else f"a FlexFL {run.kind} run"
    deadline = run.deadline_s if run.deadline_s is not None and run.deadline_s > 0 else None
    followed = sorted({info.trace for info in run.devices.values() if info.trace})
    description = (
        f"Converted with `flexfl traces from-run` from {what} in {run.path} ({len(rows)} rounds, "
        f"{min(rows)}-{max(rows)}). Per round, the fraction of the E = {E} required local updates each device's "
        f"update carried" + (f" under a {deadline:g} s deadline" if deadline else " (no deadline)") + ". A device's "
        "trace holds only the rounds it was asked to train in: rounds before it arrived or after it left are absent, "
        f"not zeros. {UPLOAD_NOTE[engine]}."
        + (f" Its devices followed traces ({', '.join(followed)}): the set repeats those draws, not the devices' own "
           "conditions." if followed else ""))
    last = rows[max(rows)]
    source: dict[str, Any] = {
        "converter": "flexfl.app.run_traces", "command": command, "run": str(run.path), "engine": engine,
        "run_kind": run.kind, "read": list(run.sources),
        "rounds": {"count": len(rows), "first": min(rows), "last": max(rows),
                   "rule": "per device, the rounds it was a participant of, less a round at whose close it departed "
                           "without having been sent the model"},
        "rules": dict(last.rules) if last.rules is not None else None, "columns": COLUMNS,
        "upload_s": UPLOAD_NOTE[engine], "software": {"flexfl": __version__},
    }
    known = {t.name: {k: v for k, v in (("shard", run.devices[t.name].shard),
                                        ("followed_trace", run.devices[t.name].trace)) if v is not None}
             for t in traces if t.name in run.devices}
    conditions = {t: c for t, c in known.items() if c}
    return TraceManifest(schema_version=SCHEMA_VERSION, name=name, kind="recorded", description=description,
                         source=source, required_updates=E, deadline_s=deadline,
                         traces=tuple(t.name for t in traces), conditions=conditions, hosts=(), created=utc_now_iso())


def default_command(run_dir: Path, out: Path, name: str | None) -> str:
    return shlex.join(["flexfl", "traces", "from-run", str(run_dir), "--out", str(out),
                       *(["--name", name] if name else [])])
