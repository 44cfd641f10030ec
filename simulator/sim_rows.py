"""What a simulated run records per round: coordinator.rules.round_record.RoundRecord, as a live round's.

A run's metrics.jsonl lines are its records' to_json(); rounds.csv is their projection
(records_as_rows: the columns it has always had, so committed results still read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from coordinator.rules.round import RoundOpening, RoundOutcome, Weighing
from coordinator.rules.round_record import RoundRecord
from simulator.sim_config import SimConfig

# rounds.csv's columns after the run's identifying fields, each a RoundRecord attribute.
CSV_FIELDS = ("round", "lr", "active", "complete", "mean_s", "coef_sum", "discarded", "train_loss", "test_acc",
              "test_loss", "seconds", "members", "events")


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
                 extra: Mapping[str, Mapping[str, float]], reasons: Mapping[str, str] | None) -> RoundRecord:
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
                   train_loss=train_loss, seconds=seconds, members=members, rules=rules)


def records_as_rows(result: SimResult) -> list[dict]:
    """Per-round rows for CSV output: the run's identifying config fields, then the record's CSV_FIELDS."""
    c = result.config
    part = c.partition.identity()
    ident = {
        "dataset": part["dataset"], "iid": int(part["iid"]), "alpha": part.get("alpha"), "beta": part.get("beta"),
        "num_traces": c.traces.num_traces, "scheme": c.rules.aggregation.label, "seed": c.seed,
    }
    return [{**ident, **{name: getattr(r, name) for name in CSV_FIELDS}} for r in result.records]
