"""What a simulated run writes per round: its summary record (rounds.csv) and its full row (metrics.jsonl)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from coordinator.metrics import round_row
from coordinator.round import RoundOpening, RoundOutcome, Weighing
from simulator.sim_config import SimConfig


@dataclass(frozen=True)
class RoundRecord:
    round: int
    lr: float
    active: int  # devices with s > 0
    complete: int  # devices with s = E
    mean_s: float  # over the round's participants
    coef_sum: float
    discarded: bool
    train_loss: float  # coefficient-weighted mean local loss of contributors (nan if none)
    test_acc: float
    test_loss: float
    seconds: float
    members: int  # devices in the objective after the round
    events: str  # "+dev-3 -dev-0(exclude)" for arrivals/departures applied at its close


@dataclass
class SimResult:
    config: SimConfig
    records: list[RoundRecord] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # per round, coordinator.metrics.round_row schema
    trace_assignment: list[str] = field(default_factory=list)
    device_updates: int = 0  # local SGD steps actually computed, over all devices and rounds (= updates in unit step)
    wall_s: float = 0.0
    final_params: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        return self.records[-1].test_acc


def round_record(*, opening: RoundOpening, weighing: Weighing, outcome: RoundOutcome, s: Mapping[str, int],
                 E: int, losses: np.ndarray, test_acc: float, test_loss: float, seconds: float,
                 members: int) -> RoundRecord:
    """The round's summary; `losses` are the contributors' mean minibatch losses (weighing.contributors' order)."""
    coef = dict(zip(weighing.devices, weighing.coefficients.values))
    w = np.array([coef[d] for d in weighing.contributors])
    rows = weighing.contributors
    return RoundRecord(
        round=opening.round_index, lr=opening.lr, active=sum(v > 0 for v in s.values()),
        complete=sum(v == E for v in s.values()), mean_s=float(np.mean(list(s.values()))) if s else 0.0,
        coef_sum=float(weighing.coefficients.values.sum()), discarded=weighing.coefficients.discarded,
        train_loss=float(np.dot(w, losses) / w.sum()) if len(rows) and w.sum() > 0 else float("nan"),
        test_acc=test_acc, test_loss=test_loss, seconds=seconds, members=members,
        events=" ".join([f"+{d}" for d in outcome.arrivals] + [f"-{d}({p})" for d, p in outcome.departures]),
    )


def full_row(opening: RoundOpening, outcome: RoundOutcome, *, test_acc: float, test_loss: float,
             extra: Mapping[str, Any], reasons: Mapping[str, str] | None) -> dict[str, Any]:
    """The round's row in coordinator.metrics.round_row's schema, as a live run's metrics.jsonl has it."""
    row = round_row(opening, outcome, test_acc=test_acc, test_loss=test_loss)
    if extra:
        row["extra_tests"] = dict(extra)
    if reasons is not None:  # as a live run's rows record it (coordinator.finisher)
        row["stop_reason"] = dict(reasons)
    return row


def records_as_rows(result: SimResult) -> list[dict]:
    """Per-round rows for CSV output, each with the run's identifying config fields."""
    c = result.config
    part = c.partition.identity()
    ident = {
        "dataset": part["dataset"], "iid": int(part["iid"]), "alpha": part.get("alpha"), "beta": part.get("beta"),
        "num_traces": c.traces.num_traces, "scheme": c.rules.aggregation.label, "seed": c.seed,
    }
    return [{**ident, **asdict(r)} for r in result.records]
