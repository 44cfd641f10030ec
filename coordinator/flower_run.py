"""A Flower run's FlexFL run folder: what each round did, written as FlexFL's live runs write it.

The folder holds run.json (coordinator.metrics.write_run_info: kind "live", the Flower run's
config with the rules as trained, the deadline and E) and metrics.jsonl, one
coordinator.rules.round_record.RoundRecord per line (coordinator.metrics.MetricsWriter: each row
fsynced as it is written), so `flexfl report` and everything else that reads run folders reads a
Flower run as a FlexFL one. The folder is claimed as every run folder is (flexfl.run_folder): locked
while the ServerApp writes it, and an earlier run in it is never overwritten.

The rows are coordinator.flower_strategy.FlexFLStrategy's `records`, with the run's rules and the
central test's accuracy and loss added; this module needs no Flower.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coordinator.metrics import MetricsWriter, write_run_info
from coordinator.rules.config import RulesConfig
from coordinator.rules.round_record import RoundRecord, rules_record
from flexfl.run_folder import RunFolder, claim_run_folder, entries_besides_lock

METRICS_NAME = "metrics.jsonl"


@dataclass
class FlowerRunFolder:
    """A claimed folder for one Flower run; `write_new` after each round, `close` at the end."""

    path: Path
    rules: dict[str, Any]  # rules_record of the run's rules: each row's `rules`
    _folder: RunFolder
    _writer: MetricsWriter
    _written: int = 0  # records of the strategy written so far

    @classmethod
    def claim(cls, path: Path | str, *, rules: RulesConfig, dataset: str, deadline_s: float,
              config: Mapping[str, Any]) -> FlowerRunFolder:
        """Claim `path` (created; it must hold no earlier run) and write its run.json.

        `dataset` fills in the rules' eta0 and batch size where they are left out (as the strategy's
        Federation does); `config` is the Flower run's config (context.run_config), kept in run.json."""
        path = Path(path)
        folder = claim_run_folder(path, what="a Flower ServerApp (coordinator.flower_run)",
                                  holds_run=entries_besides_lock, resumable=False)
        try:
            trained = rules_record(rules, dataset=dataset)
            write_run_info(path, kind="live", config={"flower": dict(config), "rules": trained}, devices={},
                           deadline_s=deadline_s if deadline_s > 0 else None,
                           required_updates=rules.required_updates)
            writer = MetricsWriter(path / METRICS_NAME, append=False)
        except BaseException:
            folder.release()
            raise
        return cls(path=path, rules=trained, _folder=folder, _writer=writer)

    def write_new(self, records: Sequence[RoundRecord], *, evaluated_round: int, test_acc: float = math.nan,
                  test_loss: float = math.nan) -> list[RoundRecord]:
        """Append the records of `records` not written yet (the strategy's list so far), each with the run's rules;
        the one of round `evaluated_round` with the central test's `test_acc` and `test_loss`. Returns them."""
        new = [replace(r, rules=self.rules, test_acc=test_acc if r.round == evaluated_round else r.test_acc,
                       test_loss=test_loss if r.round == evaluated_round else r.test_loss)
               for r in records[self._written:]]
        self._writer.write_many([r.to_json() for r in new])
        self._written = len(records)
        return new

    def close(self) -> None:
        """Close the metrics file and give the folder up."""
        self._writer.close()
        self._folder.release()
