"""What a report reads, and the one place that knows the output formats.

A folder is one of three kinds (`detect`):
- a run: `run.json` and/or per-round records in `metrics.jsonl` or `coordinator/metrics.jsonl`
  (the coordinator's per-round schema, written by `coordinator.engine` and the simulator); a live run folder of
  without `run.json` (a run stopped before writing it) gets its deadline, E and traces from
  `coordinator.toml` and `agent-*.toml`, read with their own config loaders. A `flexfl sim run` folder
  (`rounds.csv` + `summary.json`: per-round aggregates of every scheme) is read from its
  `<scheme>/` run folders where they are there (`_scheme_runs`), else from the aggregates.
- a sweep: `schemes_<dataset>_final.csv` (with the per-run CSVs in `runs/schemes_<dataset>/`),
  or such a work folder of `<setting>_T<j>_seed<s>_<scheme>.json/.csv` files itself; or the
  Table 3 page's `table3_runs.csv` (one dataset per reading, per-run CSVs in
  `runs/table3_<dataset>/<reading>_<setting>_T<j>_seed<s>_<scheme>.csv`).
- a trace set: `manifest.json` (read by `trace_recorder.format`, its only reader).

A live run that followed a device timeline also has `conditions.jsonl` (the conditions the
emulated fleet applied per round; read by flexfl.app.live_conditions, its writer's module).

`read_run` is the adapter: a metrics.jsonl row is read as a coordinator.rules.round_record.RoundRecord
(which reads every older row), a rounds.csv row as its aggregates; `RoundRow` shows either.
Optional fields may be missing (None: shown as "n/a").
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from coordinator.rules.round_record import LiveRound, RoundRecord, RoundRecordError
from flexfl.campaign_index import INDEX_NAME as CAMPAIGN_INDEX
from flexfl.errors import ConfigError, ReportError
from loadgen.fleet_timeline import CONDITIONS_FILE, read_conditions

RUN_JSON = "run.json"
METRICS_FILES = ("metrics.jsonl", "coordinator/metrics.jsonl")
SIM_ROUNDS_CSV = "rounds.csv"
TRACE_MANIFEST = "manifest.json"
SWEEP_FINAL_RE = re.compile(r"^schemes_(?P<dataset>[A-Za-z0-9]+)_final\.csv$")
TABLE3_RUNS = "table3_runs.csv"  # written by simulator.paper.table3.write_page
SWEEP_RUN_RE = re.compile(r"^(?P<setting>[a-z]+)_T(?P<num_traces>\d+)_seed(?P<seed>\d+)_(?P<scheme>[A-Z])\.json$")


@dataclass(frozen=True)
class RoundRow:
    """One round of a run as the report shows it: its RoundRecord (a metrics.jsonl row), or only the
    aggregates a rounds.csv keeps (record None). A field is None where the run's output does not record it."""

    round: int
    scheme: str | None = None  # set when one file holds several schemes (a simulation)
    record: RoundRecord | None = None
    # rounds.csv's aggregates, where there is no record
    csv_lr: float | None = None
    csv_discarded: bool | None = None
    csv_test_acc: float | None = None
    csv_test_loss: float | None = None

    @property
    def lr(self) -> float | None:
        return _finite(self.record.lr) if self.record else self.csv_lr

    @property
    def discarded(self) -> bool | None:
        return self.record.discarded if self.record else self.csv_discarded

    @property
    def test_acc(self) -> float | None:
        return _finite(self.record.test_acc) if self.record else self.csv_test_acc

    @property
    def test_loss(self) -> float | None:
        return _finite(self.record.test_loss) if self.record else self.csv_test_loss

    @property
    def participants(self) -> tuple[str, ...] | None:
        """Devices the round was opened for."""
        return self.record.participants if self.record else None

    @property
    def devices(self) -> tuple[str, ...] | None:
        """The objective's members (the keys of s, p, coefficients)."""
        return self.record.devices if self.record else None

    @property
    def s(self) -> Mapping[str, int] | None:
        return self.record.s if self.record else None

    @property
    def p(self) -> Mapping[str, float] | None:
        return self.record.p if self.record else None

    @property
    def coefficients(self) -> Mapping[str, float] | None:
        return self.record.coefficients if self.record else None

    @property
    def stop_reason(self) -> Mapping[str, str] | None:
        """Why each device's s is what it is (edge_agent.deadline.StopReason)."""
        return self.record.stop_reason if self.record else None

    @property
    def arrivals(self) -> tuple[str, ...]:
        return self.record.arrivals if self.record else ()

    @property
    def departures(self) -> tuple[str, ...]:
        return self.record.departures if self.record else ()

    @property
    def server_step(self) -> bool:
        """An asynchronous run's server step (its row has each update's staleness), not a round."""
        return self.record is not None and self.record.staleness is not None

    @property
    def clock_s(self) -> float | None:
        """A simulation's simulated seconds at the round's close (simulator.clock); None: no clock, or a live round."""
        return self.record.clock_s if self.record else None

    @property
    def live(self) -> LiveRound | None:
        """The live part of the record (transfers, times, refusals); None in a simulation."""
        return self.record.live if self.record else None

    @property
    def close_reason(self) -> str | None:
        return self.live.close_reason if self.live else None

    @property
    def bytes_out(self) -> Mapping[str, int] | None:
        return self.live.bytes_out if self.live else None

    @property
    def bytes_in(self) -> Mapping[str, int] | None:
        return self.live.bytes_in if self.live else None

    @property
    def train_s(self) -> Mapping[str, float] | None:
        return self.live.train_s if self.live else None

    @property
    def arrived_after_s(self) -> Mapping[str, float] | None:
        return self.live.arrived_after_s if self.live else None

    @property
    def rejected(self) -> Mapping[str, tuple[str, ...]] | None:
        """Refused updates' reasons per device, in order."""
        return self.live.rejected if self.live else None

    @property
    def round_s(self) -> float | None:
        return self.live.round_s if self.live else None

    @property
    def aggregate_eval_s(self) -> float | None:
        return self.live.aggregate_eval_s if self.live else None

    @property
    def overhead_s(self) -> float | None:
        return self.live.overhead_s if self.live else None


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class DeviceInfo:
    trace: str | None = None  # trace name, None: the device followed no trace
    shard: int | None = None


@dataclass(frozen=True)
class Run:
    path: Path
    kind: str  # "live" or "sim"
    sources: tuple[str, ...]  # files read, relative to path
    rounds: tuple[RoundRow, ...]
    devices: dict[str, DeviceInfo] = field(default_factory=dict)
    deadline_s: float | None = None
    required_updates: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    # variant -> its strategy's description, where each variant had its own config (_scheme_runs)
    strategies: dict[str, str] = field(default_factory=dict)
    # round -> device -> the conditions the emulated fleet applied (flexfl.app.live_conditions); None: not recorded
    conditions: dict[int, dict[str, dict[str, Any]]] | None = None

    def variants(self) -> dict[str | None, list[RoundRow]]:
        """Rounds grouped by scheme (one group, key None, unless a file holds several schemes)."""
        out: dict[str | None, list[RoundRow]] = {}
        for r in self.rounds:
            out.setdefault(r.scheme, []).append(r)
        return out

    def strategy_of(self, variant: str | None) -> str | None:
        """How the report names a variant's strategy ("FedProx (mu = 0.01)"); None: the run does not record it.

        A variant key is a strategy's label (rounds.csv's scheme column: "C", "fednova"), which
        names its strategy but not its parameters: those come from the variant's config."""
        if variant in self.strategies:
            return self.strategies[variant]
        if variant is None:
            return strategy_description(self.config)
        return label_title(variant)


def strategy_description(config: dict[str, Any]) -> str | None:
    """The strategy a run's config ([rules.strategy], or the older strategy or scheme and mu) names, with its
    parameters."""
    from coordinator.rules.config import described_rules

    rules = config.get("rules")
    return described_rules(rules) if isinstance(rules, dict) else None


def label_title(label: str) -> str:
    """A strategy's title from its run-table label ("C" -> "Scheme C"); an unknown label as it is."""
    from coordinator.rules.strategies import title_of

    return title_of(label)


@dataclass(frozen=True)
class SweepDataset:
    dataset: str
    final: tuple[dict, ...]  # {setting, num_traces, seed, scheme, final_acc, final_loss}
    runs_dir: Path | None  # holds <prefix><setting>_T<j>_seed<s>_<scheme>.csv per-round files
    notes_file: Path | None = None
    reading: str | None = None  # Table 3's reading of the paper's setup (its runs' file prefix)

    @property
    def key(self) -> str:
        """Unique among a sweep's datasets (an HTML anchor)."""
        return self.dataset if self.reading is None else f"{self.dataset}-{self.reading}"

    @property
    def title(self) -> str:
        return self.dataset.upper() if self.reading is None else f"{self.dataset.upper()} ({self.reading})"

    @property
    def run_prefix(self) -> str:
        return "" if self.reading is None else f"{self.reading}_"


@dataclass(frozen=True)
class Sweep:
    path: Path
    datasets: tuple[SweepDataset, ...]


def detect(path: Path) -> str:
    """'run', 'sweep' or 'traces'; a ReportError naming what was looked for otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path}: no such folder")
    if (path / RUN_JSON).is_file() or any((path / m).is_file() for m in METRICS_FILES) \
            or (path / SIM_ROUNDS_CSV).is_file():
        return "run"
    if (path / TRACE_MANIFEST).is_file():
        return "traces"
    if (path / CAMPAIGN_INDEX).is_file():
        return "campaign"
    if (path / TABLE3_RUNS).is_file() or any(SWEEP_FINAL_RE.match(p.name) or SWEEP_RUN_RE.match(p.name)
                                             for p in path.iterdir()):
        return "sweep"
    raise ReportError(
        f"{path}: not a run (run.json, metrics.jsonl, coordinator/metrics.jsonl or rounds.csv), "
        f"a sweep ({TABLE3_RUNS}, schemes_<dataset>_final.csv or <setting>_T<j>_seed<s>_<scheme>.json), "
        f"a trace set (manifest.json) or a campaign ({CAMPAIGN_INDEX})")


# ---- runs ---------------------------------------------------------------------------------


def read_run(path: Path) -> Run:
    """The adapter: a run folder (any of the formats above) as a Run."""
    path = Path(path)
    meta = _read_run_json(path / RUN_JSON) if (path / RUN_JSON).is_file() else None
    metrics = next((path / m for m in METRICS_FILES if (path / m).is_file()), None)
    sources: list[str] = [RUN_JSON] if meta else []
    if metrics is not None:
        rounds = _read_metrics_jsonl(metrics)
        sources.append(str(metrics.relative_to(path)))
    elif (path / SIM_ROUNDS_CSV).is_file() and (each := _scheme_runs(path)) is not None:
        return each
    elif (path / SIM_ROUNDS_CSV).is_file():
        rounds = _read_rounds_csv(path / SIM_ROUNDS_CSV)
        sources.append(SIM_ROUNDS_CSV)
    else:
        raise ReportError(f"{path}: run folder without per-round records "
                          f"({', '.join(METRICS_FILES)} or {SIM_ROUNDS_CSV})")
    conditions = None
    if (path / CONDITIONS_FILE).is_file():
        conditions = read_conditions(path / CONDITIONS_FILE)
        sources.append(CONDITIONS_FILE)
    if meta is not None:
        return Run(path=path, sources=tuple(sources), rounds=rounds, conditions=conditions, **meta)
    if (path / "coordinator.toml").is_file() or metrics is not None:
        legacy, used = _legacy_live_meta(path)
        return Run(path=path, kind="live", sources=tuple(sources + used), rounds=rounds, conditions=conditions,
                   **legacy)
    config: dict = {}
    if (path / "summary.json").is_file():
        config = _load_json(path / "summary.json").get("config") or {}
        sources.append("summary.json")
    E = config.get("E")
    return Run(path=path, kind="sim", sources=tuple(sources), rounds=rounds, config=config,
               required_updates=E if isinstance(E, int) else None)


def _scheme_runs(path: Path) -> Run | None:
    """A `flexfl sim run` folder of several schemes as one Run of every scheme's full records.

    Its rounds.csv holds per-round aggregates only; each scheme's own folder (<scheme>/run.json
    and metrics.jsonl) holds s, p and coefficients per device. The schemes share devices, traces
    and E. None if a scheme of rounds.csv has no such folder (then the aggregates are read)."""
    named = list(dict.fromkeys(r.scheme for r in _read_rounds_csv(path / SIM_ROUNDS_CSV)))
    schemes = [s for s in named if s is not None]
    if not schemes or len(schemes) < len(named) or not all(
            (path / s / RUN_JSON).is_file() and (path / s / METRICS_FILES[0]).is_file() for s in schemes):
        return None
    runs = {s: read_run(path / s) for s in schemes}
    first = runs[schemes[0]]
    config = dict(first.config)
    if isinstance(config.get("rules"), dict):  # the one setting the schemes' configs differ in
        config["rules"] = {**config["rules"], "scheme": ", ".join(schemes)}
    strategies = {s: run.strategy_of(None) or label_title(s) for s, run in runs.items()}
    return replace(first, path=path, sources=tuple(f"{s}/{src}" for s, run in runs.items() for src in run.sources),
                   rounds=tuple(replace(r, scheme=s) for s, run in runs.items() for r in run.rounds), config=config,
                   strategies=strategies)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not valid JSON: {exc}") from None


def _read_run_json(path: Path) -> dict[str, Any]:
    d = _load_json(path)
    if not isinstance(d, dict):
        raise ReportError(f"{path}: expected a JSON object")
    kind = d.get("kind", "live")
    if kind not in ("live", "sim"):
        raise ReportError(f"{path}: field 'kind': expected 'live' or 'sim', got {kind!r}")
    devices_raw = d.get("devices") or {}
    if not isinstance(devices_raw, dict):
        raise ReportError(f"{path}: field 'devices': expected an object of device id -> {{trace, shard}}")
    devices = {}
    for dev, info in devices_raw.items():
        if not isinstance(info, dict):
            raise ReportError(f"{path}: field 'devices.{dev}': expected an object with trace and shard")
        devices[str(dev)] = DeviceInfo(trace=_opt(info.get("trace"), str, path, f"devices.{dev}.trace"),
                                       shard=_opt(info.get("shard"), int, path, f"devices.{dev}.shard"))
    config = d.get("config") or {}
    if not isinstance(config, dict):
        raise ReportError(f"{path}: field 'config': expected an object")
    return dict(kind=kind, devices=devices, config=config,
                deadline_s=_opt(d.get("deadline_s"), float, path, "deadline_s"),
                required_updates=_opt(d.get("required_updates"), int, path, "required_updates"))


def _opt(value: Any, kind: type, where: Path | str, name: str) -> Any:
    """value converted to kind (None stays None); a ReportError naming the field otherwise."""
    if value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number if kind in (int, float) else isinstance(value, kind)
    if kind is int and isinstance(value, float) and not value.is_integer():
        ok = False
    if not ok:
        raise ReportError(f"{where}: field '{name}': expected {kind.__name__}, got {value!r}")
    value = kind(value)
    if kind is float and not math.isfinite(value):
        return None
    return value


def _read_metrics_jsonl(path: Path) -> tuple[RoundRow, ...]:
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines):  # a torn last line from a crash: the rounds before it stand
                break
            raise ReportError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
        try:
            rec = RoundRecord.from_json(record, where=f"{path}:{i}")
        except RoundRecordError as exc:
            raise ReportError(str(exc)) from None
        rows.append(RoundRow(round=rec.round, record=rec))
    return tuple(rows)


def _read_rounds_csv(path: Path) -> tuple[RoundRow, ...]:
    """`flexfl sim run`'s per-round aggregates (one row per scheme and round)."""
    # Here, not at the top: simulator.sim_rows imports torch (3 s), which a live run's report never needs.
    from simulator.sim_rows import read_rounds_csv

    return tuple(RoundRow(round=r.round, scheme=r.scheme, csv_lr=r.lr, csv_discarded=r.discarded,
                          csv_test_acc=_finite(r.test_acc), csv_test_loss=_finite(r.test_loss))
                 for r in read_rounds_csv(path))


def _number(text: str | None, kind: type, where: str, name: str) -> Any:
    if text is None or text == "" or text.lower() == "nan":
        return None
    try:
        return kind(text)
    except ValueError:
        raise ReportError(f"{where}: field '{name}': expected {kind.__name__}, got {text!r}") from None


def _legacy_live_meta(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Deadline, E, config and per-device traces of a live run folder without run.json (an aborted run)."""
    from coordinator.config import load_coordinator_config
    from edge_agent.config import load_agent_config
    from flexfl.config import to_dict

    used: list[str] = []
    config: dict[str, Any] = {}
    deadline_s = required_updates = None
    coord = path / "coordinator.toml"
    try:
        if coord.is_file():
            cfg = load_coordinator_config(coord)
            config = to_dict(cfg)
            deadline_s, required_updates = cfg.run.deadline_s, cfg.rules.required_updates
            used.append(coord.name)
        devices: dict[str, DeviceInfo] = {}
        for agent in sorted(path.glob("agent-*.toml"), key=lambda p: natural_key(p.name)):
            a = load_agent_config(agent)
            trace = None
            if a.participation.trace:  # "<trace set folder>:<trace name>"
                trace_set, _, trace = a.participation.trace.rpartition(":")
                config.setdefault("traces", {}).setdefault("set", trace_set)
            devices[a.device_id] = DeviceInfo(trace=trace, shard=a.shard_index)
            used.append(agent.name)
    except ConfigError as exc:
        raise ReportError(str(exc)) from None
    return dict(config=config, deadline_s=deadline_s, required_updates=required_updates, devices=devices), used


def natural_key(text: str) -> tuple:
    """Sort key that puts dev-2 before dev-10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


# ---- sweeps -------------------------------------------------------------------------------


def read_sweep(path: Path) -> Sweep:
    """A results folder (table3_runs.csv, schemes_<dataset>_final.csv) or a sweep's work folder of per-run files."""
    path = Path(path)
    datasets = _read_table3_runs(path) if (path / TABLE3_RUNS).is_file() else []
    for final in sorted(path.glob("schemes_*_final.csv")):
        m = SWEEP_FINAL_RE.match(final.name)
        if not m:
            continue
        dataset = m["dataset"]
        runs_dir = path / "runs" / f"schemes_{dataset}"
        notes = path / f"schemes_{dataset}.md"
        datasets.append(SweepDataset(dataset=dataset, final=_read_final_csv(final),
                                     runs_dir=runs_dir if runs_dir.is_dir() else None,
                                     notes_file=notes if notes.is_file() else None))
    if not datasets:
        by_dataset: dict[str, list[dict]] = {}
        for p in sorted(path.iterdir()):
            m = SWEEP_RUN_RE.match(p.name)
            if not m:
                continue
            d = _load_json(p)
            dataset = str(((d.get("config") or {}).get("partition") or {}).get("dataset", "unknown"))
            by_dataset.setdefault(dataset, []).append({
                "setting": m["setting"], "num_traces": int(m["num_traces"]), "seed": int(m["seed"]),
                "scheme": m["scheme"], "final_acc": _opt(d.get("final_acc"), float, p, "final_acc"),
                "final_loss": _opt(d.get("final_loss"), float, p, "final_loss")})
        datasets = [SweepDataset(dataset=k, final=tuple(v), runs_dir=path) for k, v in sorted(by_dataset.items())]
    if not datasets:
        raise ReportError(f"{path}: no sweep results (schemes_<dataset>_final.csv or per-run JSON files)")
    return Sweep(path=path, datasets=tuple(datasets))


def _read_table3_runs(path: Path) -> list[SweepDataset]:
    """One SweepDataset per (dataset, reading) of the Table 3 page's per-run summary."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row, raw in _read_final_csv(path / TABLE3_RUNS, extra=("dataset", "reading")):
        groups.setdefault((raw["dataset"], raw["reading"]), []).append(row)
    notes = path / "table3.md"
    return [SweepDataset(dataset=dataset, final=tuple(rows), reading=reading,
                         runs_dir=path / "runs" / f"table3_{dataset}" if (path / "runs" / f"table3_{dataset}").is_dir()
                         else None, notes_file=notes if notes.is_file() else None)
            for (dataset, reading), rows in groups.items()]


def _read_final_csv(path: Path, *, extra: tuple[str, ...] = ()) -> tuple:
    """The rows of a per-run summary CSV; with `extra` columns, (row, raw row) pairs."""
    rows = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"setting", "num_traces", "seed", "scheme", "final_acc", *extra} - set(reader.fieldnames or ())
        if missing:
            raise ReportError(f"{path}:1: missing columns {sorted(missing)}")
        for raw in reader:
            where = f"{path}:{reader.line_num}"
            row = {"setting": raw["setting"], "num_traces": _number(raw["num_traces"], int, where, "num_traces"),
                   "seed": _number(raw["seed"], int, where, "seed"), "scheme": raw["scheme"],
                   "final_acc": _number(raw["final_acc"], float, where, "final_acc"),
                   "final_loss": _number(raw.get("final_loss"), float, where, "final_loss")}
            rows.append((row, raw) if extra else row)
    return tuple(rows)


def read_sweep_curve(runs_dir: Path, *, setting: str, num_traces: int, seed: int, scheme: str,
                     prefix: str = "") -> list[float] | None:
    """Test accuracy per round of one sweep run, or None if its CSV is not there."""
    path = runs_dir / f"{prefix}{setting}_T{num_traces}_seed{seed}_{scheme}.csv"
    if not path.is_file():
        return None
    return [r.test_acc if r.test_acc is not None else math.nan for r in _read_rounds_csv(path)]
