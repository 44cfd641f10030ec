"""What a coordinator's output folder holds across a crash, and how --resume takes it up again.

The folder: metrics.jsonl (a row per round), checkpoint.pt (coordinator/checkpoint.py) and
events.jsonl, the journal of announced departures and returns. The finisher writes (and
fsyncs) each round's row before its checkpoint (coordinator/finisher.py), so a resumed
coordinator drops rows of rounds its checkpoint does not hold (they run again) and reports
rounds that have no row. The journal is appended as events happen: a crash before the next
checkpoint must not lose a departure, since the device is gone and will not announce it again.

The checkpoint and every row hold the run's rules (strategy and its parameters, E, eta0,
unit, batch size, fast-reboot, departure policy: coordinator.rules.round_record.rules_record). A
resume under other rules would mix two experiments in one folder: it is refused, naming each
changed setting, unless the user allows it; then the first row after the resume records the change.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coordinator.checkpoint import Checkpoint, checkpointed_round, load_checkpoint
from coordinator.metrics import MetricsWriter, read_metrics_and_torn
from coordinator.registry import Registry
from coordinator.rules.objective import Objective
from coordinator.rules.round import Federation
from coordinator.rules.round_record import rule_changes
from flexfl.errors import AggregationError, ConfigError
from flexfl.run_folder import RunFolder, claim_run_folder

if TYPE_CHECKING:
    from coordinator.membership import Membership  # which appends to the journal through this module

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"  # in the output folder, beside metrics.jsonl
METRICS_NAME = "metrics.jsonl"
EVENTS_NAME = "events.jsonl"


def earlier_run(folder: Path) -> str | None:
    """What run a coordinator's output folder holds (flexfl.run_folder), None if nothing worth keeping.

    A checkpoint of round 0 (a coordinator stopped before its first round) holds no training.
    """
    found = []
    metrics = folder / METRICS_NAME
    if metrics.exists() and metrics.stat().st_size > 0:
        with open(metrics, "rb") as f:
            found.append(f"{METRICS_NAME} with {sum(1 for _ in f)} rows")
    checkpoint = folder / CHECKPOINT_NAME
    if checkpoint.exists():
        done = checkpointed_round(checkpoint)
        if done is None:
            found.append(f"an unreadable {CHECKPOINT_NAME}")
        elif done > 0:
            found.append(f"a checkpoint after round {done}")
    return "; ".join(found) or None


def restore(federation: Federation, path: Path, *, expected: dict[str, tuple[tuple[int, ...], np.dtype]],
            strategy: str) -> Checkpoint:
    """Set `federation` (model, round, objective, update memory) from the checkpoint at `path`; returns it.

    The caller restores the rest (run id, registry) from the returned checkpoint.
    """
    ckpt = load_checkpoint(path, expected=expected)
    federation.params = {n: v.clone() for n, v in ckpt.params.items()}
    federation.completed_round = ckpt.completed_round
    federation.objective = Objective.from_dict(ckpt.objective)
    if federation.memory is not None:
        if ckpt.memory is None:
            raise ConfigError(f"checkpoint {path} holds no update memory, which strategy {strategy!r} needs to "
                              "resume (written under another strategy)")
        try:
            federation.memory.restore(ckpt.memory)
        except (AggregationError, KeyError, TypeError) as exc:
            raise ConfigError(f"checkpoint {path}: its update memory is malformed: {exc}") from None
    return ckpt


def repair_metrics(path: Path, *, completed_round: int) -> None:
    """Keep rows of checkpointed rounds (1..completed_round) only; say which rounds have no row."""
    if not path.exists():
        return
    rows, torn = read_metrics_and_torn(path)
    kept = [row for row in rows if row.round <= completed_round]
    if torn:
        # A crash mid-write left part of a row: appending after it would glue the next row to
        # it. Set the fragments aside (nothing is deleted) and rewrite the file clean.
        aside = path.with_name(path.name + ".torn")
        with open(aside, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in torn))
        log.warning("metrics.jsonl held %d torn line(s) from a crash: moved to %s", len(torn), aside)
    if len(kept) != len(rows):
        redo = sorted({row.round for row in rows} - {row.round for row in kept})
        log.warning("metrics hold rows of rounds %s that the checkpoint does not: they run again", redo)
    if torn or len(kept) != len(rows):
        MetricsWriter.rewrite(path, [row.to_json() for row in kept])
    missing = sorted(set(range(1, completed_round + 1)) - {row.round for row in kept})
    if missing:
        log.warning("metrics have no row for rounds %s (written by a version that checkpointed first)", missing)


def changed_rules(ckpt: Checkpoint, rules: dict[str, Any], *, path: Path,
                  allow_rule_change: bool) -> dict[str, tuple[Any, Any]]:
    """What differs between the checkpoint's rules and `rules` (setting -> (old, new)); ConfigError when
    something does and the change is not allowed. A checkpoint without rules (an older one) cannot be checked."""
    if ckpt.rules is None:
        log.warning("checkpoint %s records no rules (written by an older version): the resumed run's rules are "
                    "not compared with the run's", path)
        return {}
    changes = rule_changes(ckpt.rules, rules)
    if not changes:
        return {}
    listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())
    if not allow_rule_change:
        raise ConfigError(f"--resume: the rules differ from those of the run in {path.parent} ({listed}): one folder "
                          "would hold two experiments. Resume with the run's rules, start a new run (--fresh), or "
                          "pass --allow-rule-change to continue under these (the next row records the change)")
    log.warning("resuming under changed rules (--allow-rule-change): %s", listed)
    return changes


def append_event(path: Path, *, event: str, device_id: str, after_round: int) -> None:
    """Append a membership event ("leave", "rejoin") to the journal and fsync it (departures are rare)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": event, "device": device_id, "after_round": after_round}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def journaled_events(path: Path) -> dict[str, str]:
    """Each device's last journaled event ({} without a journal); unreadable lines are skipped with a warning."""
    if not path.exists():
        return {}
    last: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            e = json.loads(line)
            last[str(e["device"])] = str(e["event"])
        except (ValueError, KeyError, TypeError):
            log.warning("%s line %d is unreadable (a crash mid-write?): skipped", path, n)
    return last


def open_run(out: Path, *, federation: Federation, membership: Membership, expected: dict, strategy: str,
             resume: bool, fresh: bool, rules: dict[str, Any], allow_rule_change: bool = False,
             ) -> tuple[RunFolder, MetricsWriter, str | None, dict[str, Any] | None]:
    """Claim the output folder `out` for a coordinator; with `resume`, take up the run it holds.

    Returns the claimed folder (held until the run ends), the metrics writer, the resumed
    run's id and the rules its checkpoint records (None and None for a new run). Resuming
    refuses rules other than the checkpoint's unless `allow_rule_change` (changed_rules), restores
    the federation and the membership from the checkpoint and the journal, then repairs
    metrics.jsonl to the checkpoint's round; a refused resume changes nothing.
    """
    folder = claim_run_folder(out, what="flexfl coordinator", holds_run=earlier_run, resume=resume, fresh=fresh)
    if folder.moved_aside is not None:
        log.info("--fresh: moved the earlier run in %s to %s", out, folder.moved_aside)
    try:
        run_id, resumed_rules = None, None
        if resume:
            ckpt = restore(federation, out / CHECKPOINT_NAME, expected=expected, strategy=strategy)
            changed_rules(ckpt, rules, path=out / CHECKPOINT_NAME, allow_rule_change=allow_rule_change)
            run_id, resumed_rules = ckpt.run_id, ckpt.rules
            membership.restore(Registry.from_dict(ckpt.registry), journaled_events(out / EVENTS_NAME))
            log.info("resumed from %s after round %d", out / CHECKPOINT_NAME, federation.completed_round)
            repair_metrics(out / METRICS_NAME, completed_round=federation.completed_round)
        return folder, MetricsWriter(out / METRICS_NAME, append=resume), run_id, resumed_rules
    except BaseException:
        folder.release()
        raise
