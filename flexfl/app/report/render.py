"""Lay out a report: the numbers (`sections`) and figures (`plots`) into one HTML page (Jinja2)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import jinja2

from flexfl import __version__
from flexfl.app.report import data, plots, sections
from flexfl.errors import ReportError
from flexfl.files import atomic_file
from loadgen.fleet_timeline import CONDITIONS_FILE, POLL_S

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"  # beside a run, where the command that wrote the run puts its report
REPORTS_DIR = Path("out") / "report"  # `flexfl report`'s own folder (out/ is not tracked)
# Never listed: a run from before the token moved out of results folders (flexfl.run_folder.secrets_dir) holds one.
SECRET_FILES = frozenset({"fleet_token"})


def default_out(path: Path) -> Path:
    """out/report/<the folder's path from here, "/" as "-">.html, e.g. out/report/traces-paper.html.

    Never inside the folder read: results/ and traces/<set> are committed, and a report left
    there was an untracked file in a tracked folder."""
    folder = Path(path).resolve()
    try:
        rel = folder.relative_to(Path.cwd().resolve())
    except ValueError:
        rel = folder.relative_to(folder.anchor)
    return REPORTS_DIR / f"{'-'.join(rel.parts) or folder.name or 'root'}.html"
NA = "n/a"


def _fmt(value: Any, spec: str = "", suffix: str = "") -> str:
    """A value formatted with `spec`, or "n/a" where the run did not record it."""
    if value is None or (isinstance(value, float) and value != value):
        return NA
    return f"{value:{spec}}{suffix}"


def _num(value: float | None) -> str:
    """A measured number for a table: thousands separated when large, 4 significant digits otherwise."""
    if value is None or value != value:
        return NA
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"


def _pct(value: float | None, digits: int = 1) -> str:
    return NA if value is None else f"{100 * value:.{digits}f} %"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("flexfl.app.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = _fmt
    env.filters["pct"] = _pct
    env.filters["num"] = _num
    return env


def write_report(path: Path, out: Path | None = None) -> Path:
    """Write the HTML report of a run, sweep or trace-set folder; returns the file written.

    The page is self-contained (figures inlined as SVG data URIs, CSS inline, no scripts),
    so it opens offline. Default location: default_out(path), under out/report/.
    """
    path = Path(path)
    kind = data.detect(path)
    started = time.perf_counter()
    context = {"run": _run_context, "sweep": _sweep_context, "traces": _traces_context,
               "campaign": _campaign_context}[kind](path)
    context.update(path=str(path), generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"), version=__version__)
    html = _environment().get_template(f"{kind}.html").render(**context)
    out = Path(out) if out is not None else default_out(path)
    with atomic_file(out) as f:
        f.write(html)
    log.debug("report of %s (%s) in %.1f s: %s", path, kind, time.perf_counter() - started, out)
    return out


# ---- runs ---------------------------------------------------------------------------------


def _events(rows: list[data.RoundRow]) -> list[tuple[int, str, str]]:
    return ([(r.round, d, "arrival") for r in rows for d in r.arrivals]
            + [(r.round, d, "departure") for r in rows for d in r.departures])


def _run_context(path: Path) -> dict[str, Any]:
    run = data.read_run(path)
    if not run.rounds:
        raise ReportError(f"{path}: the run has no completed round yet ({', '.join(run.sources)})")
    variants = run.variants()
    series = {k: ([r.round for r in rows], [r.test_acc for r in rows], [r.test_loss for r in rows])
              for k, rows in variants.items()}
    all_events = sorted({e for rows in variants.values() for e in _events(rows)})
    timed = {k: sections.elapsed(rows) for k, rows in variants.items()}
    clocks = {t[1] for t in timed.values() if t is not None}
    acc_time_svg = (plots.accuracy_time({k: (t[0], [r.test_acc for r in variants[k]]) for k, t in timed.items()
                                         if t is not None}, clock=clocks.pop(),
                                        titles={k: run.strategy_of(k) for k in series})
                    if len(clocks) == 1 else None)
    blocks: list[dict[str, Any]] = []
    drawn: list[tuple[sections.Participation, list, dict[str, Any]]] = []  # each heatmap once, with its block
    for scheme, rows in variants.items():
        block: dict[str, Any] = {"scheme": scheme, "strategy": run.strategy_of(scheme),
                                 "summary": sections.run_summary(run, rows),
                                 "participation_svg": None, "participation_of": [], "coefficients_svg": None,
                                 "devices": None, "stop_reasons_svg": None, "conditions": False}
        if sections.has_per_device(rows):
            part = sections.participation(run, rows)
            same = next((b for p, ev, b in drawn if ev == _events(rows) and sections.same_participation(p, part)),
                        None)
            if same is None:  # the schemes of one simulation drew the same s: one heatmap for all (was one each)
                block["participation_svg"] = plots.participation_heatmap(part, _events(rows))
                drawn.append((part, _events(rows), block))
            block["participation_of"] = (same or block)["participation_of"]
            block["participation_of"].append(block["strategy"] or scheme)
            coef = sections.coefficient_matrix(part.devices, rows)
            block["coefficients_svg"] = (plots.coefficient_heatmap(part.devices, part.rounds, coef,
                                                                   [r.round for r in rows if r.discarded])
                                         if any(r.coefficients is not None for r in rows) else None)
            devices = sections.device_table(run, rows)
            twin = next((b for b in blocks if b["devices"] == devices), None)  # the same table: shown once too
            block["devices"] = None if twin is not None else devices
            block["devices_of"] = (twin or block).setdefault("devices_of", [])
            block["devices_of"].append(block["strategy"] or scheme)
            stopped = sections.stop_reasons(run, rows)
            applied = sections.device_conditions(run, rows)
            block["stop_reasons_svg"] = (plots.stop_reason_map(stopped, _events(rows), applied)
                                         if stopped or applied else None)
            block["conditions"] = applied is not None
        traffic = sections.traffic(rows)
        block["traffic_svg"] = plots.traffic_plot(traffic) if traffic else None
        durations = sections.durations(rows)
        block["durations_svg"] = plots.durations_plot(durations, run.deadline_s) if durations else None
        blocks.append(block)
    files = sorted((p for p in path.rglob("*") if p.is_file() and p.name != REPORT_NAME and not p.name.startswith(".")
                    and p.name not in SECRET_FILES), key=lambda p: str(p))
    shown, left_out = _what_to_show(run, blocks)
    return {
        "title": f"{run.kind} run: {path.resolve().name}",
        "run": run,
        "acc_loss_svg": plots.accuracy_loss(series, all_events, titles={k: run.strategy_of(k) for k in series}),
        "acc_time_svg": acc_time_svg,
        "blocks": blocks,
        "shown": shown,
        "counters": [(key, label) for key, label in COUNTERS if any(b["summary"][key] is not None for b in blocks)],
        "left_out": left_out,
        "conditions_poll_s": POLL_S,
        "config": sections.config_rows(run.config, path),
        "files": [(str(p.relative_to(path)), p.stat().st_size) for p in files][:200],
    }


# Optional sections of a run's page: (id, title, what a block holds for it).
SECTIONS = (("participation", "Participation", "participation_svg"),
            ("stop_reasons", "Why s stopped", "stop_reasons_svg"),
            ("conditions", "Device conditions", "conditions"),  # drawn under the stop reasons
            ("coefficients", "Aggregation coefficients", "coefficients_svg"),
            ("traffic", "Traffic", "traffic_svg"), ("durations", "Round durations", "durations_svg"),
            ("devices", "Devices", "devices"))
# The overview's counts (sections.run_summary keys), shown where the run records them.
COUNTERS = (("inactive_device_rounds", "inactive device-rounds (s = 0)"), ("rejected_updates", "rejected updates"),
            ("discarded_rounds", "discarded rounds"))


def _what_to_show(run: data.Run, blocks: list[dict[str, Any]]) -> tuple[set[str], list[tuple[str, str]]]:
    """The optional sections with data, and (title, reason) for each section or count left out.

    A section without data is left out and the overview says why, rather than a page of
    "n/a": a simulation has no network, clock or uploads to reject; a live run may lack a record."""
    sim = run.kind == "sim"
    why = {
        "participation": f"this run's output holds no per-device s ({', '.join(run.sources)})",
        "stop_reasons": ("a simulation that draws s from traces has no device stopping for a reason of its own "
                         "(one run from a device timeline, `sim run --timeline`, records why)" if sim
                         else "this run's metrics do not record why each device stopped (written before FlexFL "
                              "recorded it)"),
        "conditions": ("a simulation applies no conditions to devices (one run with --timeline reads them from the "
                       "timeline file, named in its summary.json)" if sim
                       else f"this run followed no device timeline (no {CONDITIONS_FILE}: `flexfl live --emulate "
                            "--timeline FILE` records the conditions it applies there)"),
        "coefficients": "this run's output holds no per-device coefficients",
        "traffic": ("a simulation sends nothing over a network" if sim
                    else "bytes sent and received were not recorded for this run"),
        "durations": ("a simulated round has no wall-clock duration or deadline" if sim
                      else "round durations were not recorded for this run"),
        "devices": "this run's output holds no per-device records",
        "inactive_device_rounds": "this run's output holds no per-device s",
        "rejected_updates": ("a simulation receives no uploads to reject" if sim
                             else "rejections were not recorded for this run"),
        "discarded_rounds": "this run's output does not say which rounds were discarded",
    }
    shown = {sid for sid, _, key in SECTIONS if any(b[key] for b in blocks)}
    left_out = [(title, why[sid]) for sid, title, _ in SECTIONS if sid not in shown]
    left_out += [(label.split(" (")[0], why[key]) for key, label in COUNTERS
                 if all(b["summary"][key] is None for b in blocks)]
    return shown, left_out


# ---- sweeps -------------------------------------------------------------------------------


def _sweep_context(path: Path) -> dict[str, Any]:
    sweep = data.read_sweep(path)
    datasets = []
    for ds in sweep.datasets:
        table = sections.sweep_table(ds)
        cells = []
        for setting in table.settings:
            curves = sections.sweep_curves(ds, setting)
            svg = plots.sweep_cells(ds.dataset, setting, curves, title=ds.title) if curves else None
            cells.append({"setting": setting, "svg": svg})
        datasets.append({
            "ds": ds, "table": table, "cells": cells,
            "improvements_svg": plots.sweep_improvements(ds.dataset, table,
                                                         title=ds.title) if table.ours_values else None,
            "schemes": sorted({r["scheme"] for r in ds.final}),
            "seeds": sorted({r["seed"] for r in ds.final}),
            "runs_dir": None if ds.runs_dir is None else (
                "this folder" if ds.runs_dir == path else str(ds.runs_dir.relative_to(path))),
            "notes": str(ds.notes_file.relative_to(path)) if ds.notes_file else None,
        })
    return {"title": f"sweep: {path.resolve().name}", "datasets": datasets}


# ---- campaigns ----------------------------------------------------------------------------


def _campaign_context(path: Path) -> dict[str, Any]:
    from coordinator.metrics import read_metrics
    from flexfl.campaign_index import FIGURES, RUNS_DIR, SEED_AXIS, RunState, groups, read_index

    index = read_index(path)
    grouped = groups(index, seed_key=SEED_AXIS)
    varied = [k for k in index.axes if k != SEED_AXIS]

    def group_name(values) -> str:
        return ", ".join(f"{k.rpartition('.')[2]} {values[k]}" for k in varied) or "all runs"

    curves = []
    for g in grouped:
        for r in g.runs:
            metrics = path / RUNS_DIR / r.name / "coordinator" / "metrics.jsonl"
            if r.state is not RunState.PENDING and metrics.is_file():
                rows = read_metrics(metrics)
                curves.append((group_name(g.values), r.name, [x.round for x in rows], [x.test_acc for x in rows]))
    runs = [{"r": r, "report": (path / RUNS_DIR / r.name / REPORT_NAME).is_file(),
             "href": f"{RUNS_DIR}/{r.name}/{REPORT_NAME}"} for r in index.runs]
    return {"title": f"campaign: {index.name}", "index": index, "figures": FIGURES,
            "groups": [{"name": group_name(g.values), "g": g} for g in grouped], "runs": runs,
            "ended": sum(r.state is not RunState.PENDING for r in index.runs),
            "curves_svg": plots.campaign_curves(curves) if curves else None}


# ---- trace sets ---------------------------------------------------------------------------


def _traces_context(path: Path) -> dict[str, Any]:
    from trace_recorder.format import read_trace_set

    trace_set = read_trace_set(path)  # TraceFormatError (a FlexFLError) names file, line, field
    m = trace_set.manifest
    rows = sections.trace_table(trace_set)
    # Calibrated sets sit on the grid k / required_updates; recorded ones on k / E as well.
    figures = [(t.name, plots.trace_figure(t, m.required_updates)) for t in trace_set.traces]
    extra_columns = sorted({k for r in rows for k in r.extra_means})
    return {"title": f"trace set: {m.name}", "manifest": m, "rows": rows, "figures": figures,
            "extra_columns": extra_columns}
