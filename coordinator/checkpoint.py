"""Atomic checkpoints of the coordinator: global model, round, registry, objective (schedule state), update memory.

The readers here are the only code that opens a checkpoint file (the trace recorder reads
the registry through `read_registry`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coordinator.registry import Registry
from flexfl.errors import ConfigError
from flexfl.files import atomic_file

CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    params: dict[str, torch.Tensor]
    completed_round: int
    run_id: str
    registry: dict
    objective: dict
    # A strategy with a per-device memory (MIFA): coordinator.rules.memory.UpdateMemory.snapshot(); None without
    memory: dict | None = None
    # The run's rules as data (coordinator.rules.round_record.rules_record); None: written before checkpoints held them
    rules: dict | None = None


def save_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    """Write via a temp file in the same folder, fsync, rename: a crash leaves the old or the new one."""
    with atomic_file(path, "wb", perms=0o600) as f:
        torch.save({
            "version": CHECKPOINT_VERSION, "params": {n: p.detach().cpu() for n, p in ckpt.params.items()},
            "completed_round": ckpt.completed_round, "run_id": ckpt.run_id,
            "registry": ckpt.registry, "objective": ckpt.objective,
            **({"memory": ckpt.memory} if ckpt.memory is not None else {}),
            **({"rules": ckpt.rules} if ckpt.rules is not None else {}),
        }, f)


def checkpointed_round(path: Path) -> int | None:
    """The round a checkpoint file holds, without validating it against a model (None: unreadable)."""
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
        return int(raw["completed_round"])
    except Exception:
        return None


def load_checkpoint(path: Path, *, expected: dict[str, tuple[tuple[int, ...], np.dtype]]) -> Checkpoint:
    """Read and validate a checkpoint against the model it must restore."""
    if not path.exists():
        raise ConfigError(f"--resume: no checkpoint at {path}")
    raw = _load(path)
    if not isinstance(raw, dict) or raw.get("version") != CHECKPOINT_VERSION:
        raise ConfigError(f"checkpoint {path}: unsupported or missing version (want {CHECKPOINT_VERSION})")
    params = raw.get("params", {})
    if set(params) != set(expected):
        raise ConfigError(f"checkpoint {path}: tensors {sorted(params)} do not match the model {sorted(expected)}")
    for name, (shape, _dtype) in expected.items():
        if tuple(params[name].shape) != tuple(shape):
            raise ConfigError(f"checkpoint {path}: tensor '{name}' has shape {tuple(params[name].shape)}, "
                              f"model needs {shape}")
    try:
        return Checkpoint(params=params, completed_round=int(raw["completed_round"]), run_id=str(raw["run_id"]),
                          registry=dict(raw["registry"]), objective=dict(raw["objective"]),
                          memory=dict(raw["memory"]) if raw.get("memory") is not None else None,
                          rules=dict(raw["rules"]) if raw.get("rules") is not None else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"checkpoint {path} is malformed: {exc!r}") from None


def read_registry(path: Path) -> Registry:
    """The device registry a checkpoint holds (who joined, with which hardware and agent version).

    The model in the file is not checked. ConfigError when the file is missing, unreadable or
    holds no registry.
    """
    raw = _load(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("registry"), dict):
        raise ConfigError(f"checkpoint {path} holds no device registry")
    return Registry.from_dict(raw["registry"])


def _load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt file
        raise ConfigError(f"checkpoint {path} is unreadable: {exc}") from None
