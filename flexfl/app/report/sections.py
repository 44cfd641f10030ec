"""The numbers behind each section of a report: pure functions of what `data` read.

Plots (`plots`) and the page (`render`) only draw and lay out what these return, so the
counting rules (what is inactive, rejected or absent; what a mean s/E is over) live here
once and are tested on hand-made records.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import numpy as np

from flexfl.app.report.data import DeviceInfo, RoundRow, Run, SweepDataset, natural_key, read_sweep_curve


class Cell(IntEnum):
    """A (device, round) cell of the participation heatmap."""

    ABSENT = 0  # not a participant: not yet arrived, departed, or excluded
    INACTIVE = 1  # a participant whose s = 0 (nothing valid arrived by the deadline)
    REJECTED = 2  # a participant with s = 0 whose update was rejected
    ACTIVE = 3  # s > 0: coloured by s / E


@dataclass(frozen=True)
class Participation:
    devices: list[str]
    rounds: list[int]
    state: np.ndarray  # (devices, rounds) of Cell
    fraction: np.ndarray  # (devices, rounds) s / E (s / max s if E is unknown); NaN unless ACTIVE
    rejected_any: np.ndarray  # (devices, rounds) bool: a rejection was noted (a valid update may have followed)
    scale: str  # what `fraction` divides by: "E = 20" or "max s = 17 (E unknown)"


def device_order(run: Run, rows: list[RoundRow]) -> list[str]:
    """Every device the run mentions, in natural order (dev-2 before dev-10)."""
    seen: set[str] = set(run.devices)
    for r in rows:
        for group in (r.participants, r.devices, r.s, r.coefficients, r.rejected, r.stop_reason):
            seen.update(group or ())
        seen.update(r.arrivals)
        seen.update(r.departures)
    return sorted(seen, key=natural_key)


def has_per_device(rows: list[RoundRow]) -> bool:
    return any(r.s is not None for r in rows)


def participants_of(r: RoundRow) -> tuple[str, ...]:
    """Who the round was opened for: participants, else the objective's members, else who has an s."""
    if r.participants is not None:
        return r.participants
    if r.devices is not None:
        return r.devices
    return tuple(r.s or ())


def participation(run: Run, rows: list[RoundRow]) -> Participation:
    devices = device_order(run, rows)
    index = {d: i for i, d in enumerate(devices)}
    shape = (len(devices), len(rows))
    state = np.full(shape, Cell.ABSENT, dtype=np.int8)
    s_matrix = np.full(shape, np.nan)
    rejected_any = np.zeros(shape, dtype=bool)
    for j, r in enumerate(rows):
        s = r.s or {}
        rejected = r.rejected or {}
        for d in participants_of(r):
            i = index[d]
            value = s.get(d, 0)
            if value > 0:
                state[i, j] = Cell.ACTIVE
                s_matrix[i, j] = value
            else:
                state[i, j] = Cell.REJECTED if d in rejected else Cell.INACTIVE
        for d in rejected:
            rejected_any[index[d], j] = True
    E = run.required_updates
    if E:
        scale, denom = f"E = {E}", float(E)
    else:
        top = np.nanmax(s_matrix) if np.isfinite(s_matrix).any() else 1.0
        scale, denom = f"max s = {top:g} (E unknown)", float(top)
    return Participation(devices=devices, rounds=[r.round for r in rows], state=state,
                         fraction=s_matrix / denom, rejected_any=rejected_any, scale=scale)


def same_participation(a: Participation, b: Participation) -> bool:
    """The two heatmaps would be the same picture (e.g. the schemes of one simulation: the same s drawn)."""
    return (a.devices == b.devices and a.rounds == b.rounds and a.scale == b.scale
            and np.array_equal(a.state, b.state) and np.array_equal(a.fraction, b.fraction, equal_nan=True)
            and np.array_equal(a.rejected_any, b.rejected_any))


def config_rows(config: dict, run_dir: Path) -> list[tuple[str, str]]:
    """The run's configuration as (dotted key, readable value) rows, nested tables flattened
    (`rules.required_updates`), sorted by key.

    Values as a config file would spell them (true, 0.1, a, b), not Python reprs; a path of
    this machine as the reader can use it (readable_path).
    """
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            rows.append((prefix, _readable(value, run_dir)))

    walk("", config)
    return sorted(rows)


def _readable(value: object, run_dir: Path) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None or value == "":
        return "none"
    if isinstance(value, dict):  # an empty table
        return "none"
    if isinstance(value, (list, tuple)):
        if not value:
            return "none"
        if all(isinstance(v, (str, int, float, bool)) for v in value):
            return ", ".join(_readable(v, run_dir) for v in value)
        return json.dumps(value, separators=(", ", ": "))
    if isinstance(value, str):
        return readable_path(value, run_dir)
    return str(value)


def readable_path(value: str, run_dir: Path) -> str:
    """An absolute path as the reader of a shared report can use it: relative to the run folder
    when inside it, else relative to where the report is made (e.g. traces/paper), else its
    last part after ".../" (a trace set's name). Anything else is returned as it is."""
    if not value.startswith("/"):
        return value
    path, here = Path(value), Path(run_dir).resolve()
    for base in (here, Path.cwd().resolve()):
        try:
            return str(path.relative_to(base)) or "."
        except ValueError:
            continue
    return f".../{path.name}"


def coefficient_matrix(devices: list[str], rows: list[RoundRow]) -> np.ndarray:
    """(devices, rounds) aggregation coefficient; NaN where the device is not in the objective."""
    out = np.full((len(devices), len(rows)), np.nan)
    index = {d: i for i, d in enumerate(devices)}
    for j, r in enumerate(rows):
        for d, v in (r.coefficients or {}).items():
            out[index[d], j] = v
    return out


@dataclass(frozen=True)
class DeviceRow:
    device: str
    trace: str | None
    shard: int | None
    rounds_participant: int
    mean_s_over_E: float | None  # over the rounds it was a participant
    rounds_inactive: int  # participant rounds with s = 0 (rejected ones included)
    rejected: int  # rejected updates
    reasons: list[tuple[str, int]]  # (reason, how often), most frequent first
    stopped: list[tuple[str, int]]  # (why s stopped where it did, rounds), most frequent first; [] when not recorded
    first_round: int | None
    last_round: int | None
    arrived_after: int | None  # round during which its arrival was noted
    departed_after: int | None


def device_table(run: Run, rows: list[RoundRow]) -> list[DeviceRow]:
    """One row per device: trace, mean s/E, inactive rounds, rejected updates and why."""
    out = []
    E = run.required_updates
    for d in device_order(run, rows):
        info = run.devices.get(d, DeviceInfo())
        rounds = [r for r in rows if d in participants_of(r)]
        s_values = [(r.s or {}).get(d, 0) for r in rounds]
        reasons = Counter(why for r in rows for why in (r.rejected or {}).get(d, ()))  # each refused update
        stopped = Counter((r.stop_reason or {})[d] for r in rows if d in (r.stop_reason or {}))
        out.append(DeviceRow(
            device=d, trace=info.trace, shard=info.shard, rounds_participant=len(rounds),
            mean_s_over_E=float(np.mean(s_values)) / E if E and s_values else None,
            rounds_inactive=sum(v == 0 for v in s_values), rejected=sum(reasons.values()),
            reasons=reasons.most_common(), stopped=stopped.most_common(),
            first_round=rounds[0].round if rounds else None,
            last_round=rounds[-1].round if rounds else None,
            arrived_after=next((r.round for r in rows if d in r.arrivals), None),
            departed_after=next((r.round for r in rows if d in r.departures), None),
        ))
    return out


@dataclass(frozen=True)
class StopReasons:
    """Device x round: the s each device got and why it stopped there (live runs that record it)."""

    devices: list[str]
    rounds: list[int]
    reason: np.ndarray  # (devices, rounds) str: edge_agent.deadline.StopReason's value; "" where not recorded
    s: np.ndarray  # (devices, rounds) s; -1 where the row has none for the device


def stop_reasons(run: Run, rows: list[RoundRow]) -> StopReasons | None:
    """Each device's s and stop reason per round; None if no row records a reason (a simulation, an older run)."""
    if not any(r.stop_reason for r in rows):
        return None
    devices = device_order(run, rows)
    index = {d: i for i, d in enumerate(devices)}
    reason = np.full((len(devices), len(rows)), "", dtype=object)
    s = np.full((len(devices), len(rows)), -1, dtype=np.int64)
    for j, r in enumerate(rows):
        for d, why in (r.stop_reason or {}).items():
            reason[index[d], j] = why
        for d, v in (r.s or {}).items():
            s[index[d], j] = v
    return StopReasons(devices=devices, rounds=[r.round for r in rows], reason=reason, s=s)


@dataclass(frozen=True)
class DeviceConditions:
    """Device x round: the conditions the emulated fleet applied at each round's opening (live runs on a timeline).

    Same devices and rounds as StopReasons, so the two maps line up. NaN / -1: not recorded (a device
    not joined yet, a round the driver missed); rates None in the record (unshaped) are NaN too."""

    devices: list[str]
    rounds: list[int]
    cpu_share: np.ndarray  # (devices, rounds) the timeline's share of the device's full compute
    cpu_quota: np.ndarray  # (devices, rounds) the quota set, CPUs; NaN: none (or not recorded)
    up_kbit: np.ndarray  # (devices, rounds) kbit/s
    down_kbit: np.ndarray  # (devices, rounds) kbit/s
    online: np.ndarray  # (devices, rounds) 1 online, 0 offline, -1 not recorded


def device_conditions(run: Run, rows: list[RoundRow]) -> DeviceConditions | None:
    """The conditions in force per device and round; None if the run recorded none (no timeline, or an older run)."""
    if not run.conditions:
        return None
    devices = device_order(run, rows)
    seen = set(devices)
    devices += sorted({d for c in run.conditions.values() for d in c if d not in seen}, key=natural_key)
    index = {d: i for i, d in enumerate(devices)}
    shape = (len(devices), len(rows))
    out = {k: np.full(shape, np.nan) for k in ("cpu_share", "cpu_quota", "up_kbit_s", "down_kbit_s")}
    online = np.full(shape, -1, dtype=np.int8)
    for j, r in enumerate(rows):
        for d, settings in (run.conditions.get(r.round) or {}).items():
            i = index[d]
            for k, matrix in out.items():
                matrix[i, j] = np.nan if settings.get(k) is None else settings[k]
            online[i, j] = 1 if settings.get("online") else 0
    return DeviceConditions(devices=devices, rounds=[r.round for r in rows], cpu_share=out["cpu_share"],
                            cpu_quota=out["cpu_quota"], up_kbit=out["up_kbit_s"], down_kbit=out["down_kbit_s"],
                            online=online)


def traffic(rows: list[RoundRow]) -> dict[str, list[float]] | None:
    """Per round, bytes sent (models out) and received (updates in); None if the run has none."""
    if not any(r.bytes_out or r.bytes_in for r in rows):
        return None
    return {"round": [r.round for r in rows],
            "bytes_out": [float(sum((r.bytes_out or {}).values())) for r in rows],
            "bytes_in": [float(sum((r.bytes_in or {}).values())) for r in rows]}


def durations(rows: list[RoundRow]) -> dict[str, list] | None:
    """Per round: open-to-close seconds, aggregation + evaluation seconds, why it closed, and
    each update's arrival after its model's delivery; None if the run recorded no durations."""
    if not any(r.round_s is not None for r in rows):
        return None
    return {
        "round": [r.round for r in rows],
        "round_s": [math.nan if r.round_s is None else r.round_s for r in rows],
        "aggregate_eval_s": [math.nan if r.aggregate_eval_s is None else r.aggregate_eval_s for r in rows],
        "close_reason": [r.close_reason for r in rows],
        "arrivals": [(r.round, v) for r in rows for v in (r.arrived_after_s or {}).values()],
    }


def elapsed(rows: list[RoundRow]) -> tuple[list[float], str] | None:
    """Seconds at each row's close, and which clock: a simulation's simulated one (clock_s, simulator.clock), or a
    live run's wall clock since its first round opened (the first row's time less its round and its aggregation
    and evaluation); None when the rows have neither."""
    clock = [r.clock_s for r in rows]
    if rows and all(c is not None for c in clock):
        return [float(c) for c in clock if c is not None], "simulated"
    if rows and all(r.live is not None for r in rows):
        lives = [r.live for r in rows if r.live is not None]
        start = lives[0].time - lives[0].round_s - lives[0].aggregate_eval_s
        return [lv.time - start for lv in lives], "wall"
    return None


def run_summary(run: Run, rows: list[RoundRow]) -> dict[str, object]:
    """Headline figures of one variant: rounds, final and best accuracy, inactive and rejected counts."""
    acc = [r.test_acc for r in rows if r.test_acc is not None]
    per_device = has_per_device(rows)
    return {
        "rounds": len(rows),
        "rounds_label": "server steps" if rows and all(r.server_step for r in rows) else "rounds",
        "final_acc": rows[-1].test_acc if rows else None,
        "final_loss": rows[-1].test_loss if rows else None,
        "best_acc": max(acc) if acc else None,
        "inactive_device_rounds": sum(1 for r in rows for d in participants_of(r) if (r.s or {}).get(d, 0) == 0)
        if per_device else None,
        "rejected_updates": (sum(len(r.rejected or {}) for r in rows)
                             if any(r.rejected is not None for r in rows) else None),
        "discarded_rounds": (sum(bool(r.discarded) for r in rows)
                             if any(r.discarded is not None for r in rows) else None),
        "arrivals": [(r.round, d) for r in rows for d in r.arrivals],
        "departures": [(r.round, d) for r in rows for d in r.departures],
    }


# ---- sweeps -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepTable:
    settings: list[str]
    num_traces: list[int]  # columns 1..8
    ours: dict[tuple[str, int], tuple[str, str]]  # (B over A, C over B), each mean ± sd over seeds
    paper: dict[tuple[str, int], tuple[str, str]]
    ours_values: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]  # per seed
    final_acc: dict[tuple[str, int, str], tuple[float, int]]  # mean final accuracy, seeds


def sweep_table(ds: SweepDataset) -> SweepTable:
    """Table 3 cells of one dataset (the simulator's own rule) beside the paper's values."""
    from simulator.paper_numbers import PAPER_TABLE3
    from simulator.report import table3_cells

    rows = [r for r in ds.final if r["final_acc"] is not None]
    settings = sorted({r["setting"] for r in rows}, key=lambda s: (s != "iid", s))
    cells = table3_cells(rows)
    paper = {}
    for setting in settings:
        for j, (b_a, c_b) in enumerate(PAPER_TABLE3.get((ds.dataset, setting), []), start=1):
            paper[(setting, j)] = (f"{b_a}", f"{c_b}")
    final: dict[tuple[str, int, str], list[float]] = {}
    for r in rows:
        final.setdefault((r["setting"], r["num_traces"], r["scheme"]), []).append(r["final_acc"])
    return SweepTable(
        settings=settings, num_traces=list(range(1, 9)),
        ours={k: c.parts() for k, c in cells.items()}, paper=paper,
        ours_values={k: (c.b_over_a, c.c_over_b) for k, c in cells.items()},
        final_acc={k: (float(np.mean(v)), len(v)) for k, v in final.items()},
    )


def sweep_curves(ds: SweepDataset, setting: str) -> dict[int, dict[str, np.ndarray]]:
    """{|T|: {scheme: (seeds, rounds) test accuracy}} of one setting, from the per-run CSVs."""
    if ds.runs_dir is None:
        return {}
    out: dict[int, dict[str, list[list[float]]]] = {}
    for r in ds.final:
        if r["setting"] != setting:
            continue
        curve = read_sweep_curve(ds.runs_dir, setting=setting, num_traces=r["num_traces"], seed=r["seed"],
                                 scheme=r["scheme"], prefix=ds.run_prefix)
        if curve:
            out.setdefault(r["num_traces"], {}).setdefault(r["scheme"], []).append(curve)
    result: dict[int, dict[str, np.ndarray]] = {}
    for j, by_scheme in sorted(out.items()):
        result[j] = {}
        for scheme, curves in sorted(by_scheme.items()):
            n = min(len(c) for c in curves)  # an interrupted run is cut to the common length
            result[j][scheme] = np.array([c[:n] for c in curves])
    return result


# ---- trace sets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRow:
    name: str
    condition: str
    rounds: int
    first_round: int
    last_round: int
    mean_pct: float
    std_pct: float
    zero_share: float
    paper_mean_pct: float | None
    paper_std_pct: float | None
    extra_means: dict[str, float]  # recorded sets: mean of each extra column (train_s, upload_s, ...)


def trace_table(trace_set) -> list[TraceRow]:
    """Each trace's statistics (population std, as Table 2) beside the paper's values of the same name."""
    from trace_recorder.calibrate import PAPER_TABLE2

    rows = []
    for t in trace_set.traces:
        paper = PAPER_TABLE2.get(t.name)
        cond = trace_set.manifest.conditions.get(t.name, {})
        rows.append(TraceRow(
            name=t.name,
            condition=", ".join(f"{k}={v}" for k, v in cond.items()) if isinstance(cond, dict) else str(cond),
            rounds=len(t), first_round=int(t.round[0]), last_round=int(t.round[-1]),
            mean_pct=t.mean_pct, std_pct=t.std_pct, zero_share=t.zero_share,
            paper_mean_pct=paper[0] if paper else None, paper_std_pct=paper[1] if paper else None,
            extra_means={k: float(np.mean(v)) for k, v in t.extra.items()},
        ))
    return rows
