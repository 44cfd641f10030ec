"""Checkpoints of paired runs (simulator.engine.run_paired): saved atomically every so often, resumed by configs.

Every draw is seeded per round, so a resumed group ends with the uninterrupted result
(tests/unit/simulator/test_paired.py); a file saved for other configs is ignored.
"""

from __future__ import annotations

import ast
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from coordinator.rules.round_record import RoundRecord
from simulator.run_state import RunState
from simulator.sim_config import SimConfig, runs_alike

log = logging.getLogger(__name__)


def _state_key(configs: Sequence[SimConfig]) -> str:
    from flexfl.config import to_dict

    return repr([to_dict(c) for c in configs])


def _same_configs(key: object, configs: Sequence[SimConfig]) -> bool:
    """A checkpoint's configs key (_state_key) means `configs` (runs_alike, pairwise)."""
    if key == _state_key(configs):
        return True
    try:
        saved = ast.literal_eval(key) if isinstance(key, str) else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    return (isinstance(saved, list) and len(saved) == len(configs)
            and all(runs_alike(d, c) for d, c in zip(saved, configs)))


def save(path: Path, configs: Sequence[SimConfig], runs: Sequence[RunState], tau: int) -> None:
    """The paired runs' state after round `tau`, written atomically."""
    from flexfl.files import atomic_file

    state = {"configs": _state_key(configs), "round": tau,
             "runs": [{"fed": r.fed, "records": r.result.records, "device_updates": r.result.device_updates}
                      for r in runs]}
    with atomic_file(Path(path), "wb") as f:
        torch.save(state, f)
    log.info("checkpoint of %d paired runs after round %d: %s", len(runs), tau, path)


def restore(path: Path | None, configs: Sequence[SimConfig], runs: Sequence[RunState]) -> int:
    """Load a checkpoint of these configs into `runs`; the last round it holds (0: none usable)."""
    if path is None or not Path(path).is_file():
        return 0
    try:
        state = torch.load(path, weights_only=False)
    except Exception as exc:  # a torn or foreign file: start over rather than fail the sweep
        log.warning("ignoring unreadable checkpoint %s: %s", path, exc)
        return 0
    if not isinstance(state, dict) or not _same_configs(state.get("configs"), configs):
        log.warning("ignoring checkpoint %s: saved for other configs", path)
        return 0
    if not all(isinstance(r, RoundRecord) for saved in state["runs"] for r in saved["records"]):
        log.warning("ignoring checkpoint %s: its rounds are recorded in an older form", path)
        return 0
    for run, saved in zip(runs, state["runs"]):
        run.fed = saved["fed"]
        run.result.records = saved["records"]
        run.result.device_updates = saved["device_updates"]
    log.info("resuming %d paired runs after round %d from %s", len(runs), state["round"], path)
    return int(state["round"])


class Checkpointer:
    """Saves the runs after a round once `every_s` seconds have passed since the last save (or the start)."""

    def __init__(self, path: Path, configs: Sequence[SimConfig], runs: Sequence[RunState], *, every_s: float) -> None:
        self.path, self.configs, self.runs, self.every_s = path, configs, runs, every_s
        self.saved_at = time.monotonic()

    def after_round(self, tau: int) -> None:
        if time.monotonic() - self.saved_at >= self.every_s:
            save(self.path, self.configs, self.runs, tau)
            self.saved_at = time.monotonic()
