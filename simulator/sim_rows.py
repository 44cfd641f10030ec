"""What a simulated run records per round: coordinator.rules.round_record.RoundRecord, as a live round's.

A run's metrics.jsonl lines are its records' to_json(); rounds.csv is their projection
(records_as_rows: the columns it has always had, so committed results still read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coordinator.rules.round import RoundOpening, RoundOutcome, Weighing
from coordinator.rules.round_record import RoundRecord
from flexfl.csv_records import read_records
from flexfl.errors import FlexFLError, ReportError
from simulator.sim_config import SimConfig

# rounds.csv's first columns, the run's identity (records_as_rows), then its CSV_FIELDS, each a
# RoundRecord attribute; a test checks that RoundsCsvRow has a field for each.
IDENT_FIELDS = ("dataset", "iid", "alpha", "beta", "num_traces", "scheme", "seed")
CSV_FIELDS = ("round", "lr", "active", "complete", "mean_s", "coef_sum", "discarded", "train_loss", "test_acc",
              "test_loss", "seconds", "members", "events")


@dataclass(frozen=True, kw_only=True)
class RoundsCsvRow:
    """One line of rounds.csv (and of a sweep's per-run CSV): the run's IDENT_FIELDS, then CSV_FIELDS.

    Only `round` is required: files written before a column existed (members and events came
    late; hand-made files in tests have a few) still read, the absent columns None."""

    dataset: str | None = None
    iid: int | None = None
    alpha: float | None = None
    beta: float | None = None
    num_traces: int | None = None
    scheme: str | None = None
    seed: int | None = None
    round: int
    lr: float | None = None
    active: int | None = None
    complete: int | None = None
    mean_s: float | None = None
    coef_sum: float | None = None
    discarded: bool | None = None
    train_loss: float | None = None
    test_acc: float | None = None
    test_loss: float | None = None
    seconds: float | None = None
    members: int | None = None
    events: str | None = None


def read_rounds_csv(path: Path, *, error: type[FlexFLError] = ReportError) -> list[RoundsCsvRow]:
    """The lines of a rounds.csv (or a sweep run's CSV), typed; `error` names the file, line and column."""
    return read_records(path, RoundsCsvRow, error=error)


def read_accuracy_curve(path: Path) -> list[float]:
    """Test accuracy per round from a rounds.csv or a sweep run's CSV; every line must have one."""
    rows = read_rounds_csv(path)
    curve = [r.test_acc for r in rows if r.test_acc is not None]
    if len(curve) < len(rows):
        missing = [r.round for r in rows if r.test_acc is None]
        raise ReportError(f"{path}: no test_acc in round(s) {missing[:5]}: not a finished run's CSV")
    return curve


@dataclass
class SimResult:
    config: SimConfig
    records: list[RoundRecord] = field(default_factory=list)
    trace_assignment: list[str] = field(default_factory=list)
    device_updates: int = 0  # local SGD steps actually computed, over all devices and rounds (= updates in unit step)
    wall_s: float = 0.0
    final_params: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The records as metrics.jsonl lines (RoundRecord.to_json), as a live run writes them.

        Without `seconds`: a run's rows are a function of its config (a resumed sweep's files equal
        an uninterrupted one's, tests/unit/simulator/test_sweep.py); its times are in rounds.csv.
        """
        return [replace(r, seconds=None).to_json() for r in self.records]

    @property
    def final_accuracy(self) -> float:
        return self.records[-1].test_acc


def round_record(*, opening: RoundOpening, weighing: Weighing, outcome: RoundOutcome, rules: Mapping[str, Any],
                 losses: np.ndarray, test_acc: float, test_loss: float, seconds: float, members: int,
                 extra: Mapping[str, Mapping[str, float]], reasons: Mapping[str, str] | None,
                 clock_s: float | None = None) -> RoundRecord:
    """The round's record: the fields a live round has (RoundRecord.of) and the simulator's.

    `losses` are the contributors' mean minibatch losses (weighing.contributors' order); `rules`
    the run's rules as data (flexfl.config.to_dict), which also give E for `complete`.
    """
    coef = dict(zip(weighing.devices, weighing.coefficients.values))
    w = np.array([coef[d] for d in weighing.contributors])
    train_loss = float(np.dot(w, losses) / w.sum()) if len(w) and w.sum() > 0 else float("nan")
    common = RoundRecord.of(opening, outcome, test_acc=test_acc, test_loss=test_loss)
    return replace(common, lr=opening.lr,
                   extra_tests=dict(extra) or None, stop_reason=None if reasons is None else dict(reasons),
                   train_loss=train_loss, seconds=seconds, members=members, rules=rules, clock_s=clock_s)


def records_as_rows(result: SimResult) -> list[dict]:
    """Per-round rows for CSV output: the run's identifying config fields, then the record's CSV_FIELDS."""
    c = result.config
    part = c.partition.identity()
    ident = dict(zip(IDENT_FIELDS, (part["dataset"], int(part["iid"]), part.get("alpha"), part.get("beta"),
                                    c.traces.num_traces, c.rules.aggregation.label, c.seed)))
    return [{**ident, **{name: getattr(r, name) for name in CSV_FIELDS}} for r in result.records]
