"""The protocols' choices files: results/operating_point.toml (eta_0 per dataset and reading of E)
and results/strategies_mu.toml (FedProx's mu per section). One owner reads them and merges a
choice into them, through the config layer (flexfl.config: its TOML reader names the file in
errors, its writer writes atomically)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flexfl.config import read_toml, write_toml


def read_choices(path: Path) -> dict[str, Any]:
    """Every table of the file ({} when it does not exist); a ConfigError naming it when it is not valid TOML."""
    path = Path(path)
    return read_toml(path) if path.exists() else {}


def write_choice(path: Path, keys: Sequence[str], entry: dict[str, Any], *, base: Path | None = None) -> dict[str, Any]:
    """Set the table at `keys` (e.g. ("mnist", "step")) to `entry` among the choices of `base` (default:
    `path` itself), write them all to `path` atomically, and return them."""
    path = Path(path)
    chosen = read_choices(path if base is None else base)
    table = chosen
    for key in keys[:-1]:
        table = table.setdefault(key, {})
    table[keys[-1]] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    write_toml(path, chosen)
    return chosen
