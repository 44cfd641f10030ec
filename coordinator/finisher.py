"""After a round closes, beside the next one: its evaluation, its metrics row and its checkpoint.

Two threads, each at most two rounds behind: an evaluator tests a closed round's model and
makes its metrics row, a writer then writes the row and the checkpoint, so evaluating round
k overlaps writing round k - 1 and neither holds up the round that is open. Rounds are taken
in order and each row is written (and fsynced) before the checkpoint of its round: a crash
between the two loses no row (coordinator/resume.py repairs the rest).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from coordinator.checkpoint import Checkpoint, save_checkpoint
from coordinator.device_rounds import DeviceRounds
from coordinator.metrics import MetricsWriter
from coordinator.open_round import OpenRound
from coordinator.registry import Registry
from coordinator.rules.round import RoundOutcome
from coordinator.rules.round_record import LiveRound, RoundRecord, rule_changes
from flexfl.errors import FlexFLError
from workloads.evaluation import evaluate
from workloads.federated import EvaluationData, FederatedData

log = logging.getLogger(__name__)


@dataclass
class ClosedRound:
    """A closed round, handed to the finisher: everything it needs, taken at the close."""

    r: OpenRound
    outcome: RoundOutcome
    reason: str
    overhead_s: float | None
    closed_at: float
    aggregate_s: float
    shards: list[int | None]  # of the objective's members after the close: they choose the test set
    run_id: str
    objective: dict  # the objective and the registry as they were at the close, for its checkpoint
    registry: Registry
    memory: dict | None  # the update memory at the close (MIFA), for its checkpoint; None: the strategy has none


class Stage:
    """A worker thread taking items in order from a bounded queue (put() blocks while it is `depth` behind).

    `work` gets the items waiting when it is free, in order (one or more: a stage that fell
    behind catches up in one go). Its first failure is kept in `error` and ends its work:
    later items are dropped, so nothing is written out of order after a failed write.
    """

    def __init__(self, name: str, work: Callable[[list], None], *, depth: int = 2) -> None:
        self.error: BaseException | None = None
        self._work = work
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: object) -> None:
        self._queue.put(item)

    def drain(self) -> None:
        """Wait until every item put so far is done (or dropped)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        closing = False
        while not closing:
            items = [self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())  # only this thread takes items
            if items[-1] is None:
                closing = True
                items.pop()
            try:
                if self.error is None and items:
                    self._work(items)
            except BaseException as exc:  # the engine thread raises it (Finisher.raise_error)
                log.exception("%s failed", self._thread.name)
                self.error = exc
            finally:
                for _ in range(len(items) + closing):
                    self._queue.task_done()


class Finisher:
    """Evaluates, records and checkpoints closed rounds in order: start(), put() each, close()."""

    def __init__(self, *, model: torch.nn.Module, data: EvaluationData | FederatedData, evaluate: bool,
                 metrics: MetricsWriter, checkpoint_path: Path, rules: dict[str, Any] | None = None,
                 resumed_rules: dict[str, Any] | None = None) -> None:
        """`rules`: the run's rules as data (round_record.rules_record), in every row and checkpoint.
        `resumed_rules`: those of the checkpoint this run resumed from; what differs (a resume the user
        allowed to change them) is recorded in the first row this finisher makes."""
        self.model = model
        self.rules = rules
        changes = rule_changes(resumed_rules, rules) if resumed_rules is not None and rules is not None else {}
        self._rule_changes: dict[str, tuple[Any, Any]] | None = changes or None
        # Until a row records the change, a checkpoint keeps the resumed rules: a run stopped before
        # its next round and resumed again is then still checked against them, and its row says so.
        self._checkpoint_rules = resumed_rules if changes else rules
        self.data = data
        self.evaluate = evaluate
        self.metrics = metrics
        self.checkpoint_path = checkpoint_path
        self._evaluator: Stage | None = None
        self._writer: Stage | None = None
        self.device_rounds = DeviceRounds()  # each device's newest round, from the rows as they are made (Status)

    def start(self) -> None:
        self._writer = Stage("round-writer", self._write)
        self._evaluator = Stage("round-evaluator", self._evaluate)

    def _stages(self) -> tuple[Stage, Stage]:
        """(evaluator, writer); a RuntimeError before start(), which is the engine's bug."""
        if self._evaluator is None or self._writer is None:
            raise RuntimeError("Finisher used before start()")
        return self._evaluator, self._writer

    def put(self, closed: ClosedRound) -> None:
        self._stages()[0].put(closed)  # blocks while it is two rounds behind

    def drain(self) -> None:
        """Wait until every closed round is evaluated and written."""
        for stage in self._stages():
            stage.drain()
        self.raise_error()

    def close(self) -> None:
        for stage in self._stages():  # the evaluator first: it hands its last rounds to the writer
            stage.close()

    @property
    def failed(self) -> BaseException | None:
        """What stopped evaluating or writing closed rounds, if anything did (the evaluator's first)."""
        for stage in (self._evaluator, self._writer):
            if stage is not None and stage.error is not None:
                return stage.error
        return None

    def raise_error(self) -> None:
        error = self.failed
        if isinstance(error, FlexFLError):
            raise error  # says what failed in one line (a plug-in model that raised, ...)
        if error is not None:
            raise RuntimeError("evaluating or writing a closed round failed (see the log)") from error

    def save(self, ckpt: Checkpoint) -> None:
        """Write a checkpoint now (the engine's, outside the pipeline: a pause, the stop), with the run's rules."""
        save_checkpoint(self.checkpoint_path, replace(ckpt, rules=self._checkpoint_rules))

    def _evaluate(self, closed: list[ClosedRound]) -> None:
        """Evaluator thread: test each round's model and make its metrics row; the writer takes both."""
        writer = self._stages()[1]
        for c in closed:
            row = self._row(c)
            self.device_rounds.note(row)
            writer.put((c, row))

    def _row(self, c: ClosedRound) -> RoundRecord:
        r = c.r
        started = time.monotonic()
        if self.evaluate:
            shards = [k for k in c.shards if k is not None]
            test = self.data.test_for(shards) if len(shards) == len(c.shards) else self.data.test
            acc, loss = evaluate(self.model, c.outcome.params, test)
        else:
            acc, loss = math.nan, math.nan
        evaluated = time.monotonic()
        updates = r.updates
        live = LiveRound(
            time=time.time(), close_reason=c.reason, left_during_round=tuple(sorted(r.left)),
            bytes_out=dict(r.bytes_out), bytes_in={d: u.bytes_in for d, u in updates.items()},
            train_s={d: u.train_s for d, u in updates.items()},
            local_loss={d: u.local_loss for d, u in updates.items()},
            previous_upload_s={d: u.previous_upload_s for d, u in updates.items()},
            arrived_after_s={d: u.arrived_after_s for d, u in updates.items()},
            delivered_after_s={d: t - r.opened_at for d, t in r.delivered.items()},
            rejected={d: tuple(v) for d, v in r.rejected.items()}, round_s=c.closed_at - r.opened_at,
            overhead_s=c.overhead_s, aggregate_s=c.aggregate_s, eval_s=evaluated - started,
            aggregate_eval_s=evaluated - c.closed_at, pull_wakeups=r.pull_wakeups)
        # the evaluator thread alone makes rows, in round order: the first one takes the resume's changes
        changes, self._rule_changes = self._rule_changes, None
        self._checkpoint_rules = self.rules
        return replace(RoundRecord.of(r.opening, c.outcome, test_acc=acc, test_loss=loss), live=live,
                       stop_reason={d: str(why) for d, why in r.stop_reasons(c.outcome.weighing.devices).items()},
                       rules=self.rules, rule_changes=changes)

    def _write(self, done: list[tuple[ClosedRound, RoundRecord]]) -> None:
        """Writer thread: the rounds' metrics rows, then the last one's checkpoint (each write fsynced).

        A writer that fell behind writes the rows of all waiting rounds with one fsync and
        only the newest checkpoint: it holds everything the older ones would, and every row
        is on disk before the checkpoint of its round or a later one.
        """
        self.metrics.write_many([row.to_json() for _, row in done])
        c, _ = done[-1]
        save_checkpoint(self.checkpoint_path, Checkpoint(
            params=c.outcome.params, completed_round=c.r.round_id, run_id=c.run_id,
            registry=c.registry.to_dict(), objective=c.objective, memory=c.memory, rules=self.rules))
        for c, row in done:
            log.info("round %d: acc %.2f%% loss %.3f, s=%s (%s)", c.r.round_id, 100 * row.test_acc,
                     row.test_loss, dict(row.s), c.reason)
