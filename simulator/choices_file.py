"""The protocols' choices files: results/operating_point.toml (eta_0 per dataset and reading of E)
and results/strategies_mu.toml (FedProx's mu per section). One owner reads them, with an error
that names the file, and merges a choice into them, written atomically."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from flexfl.errors import ConfigError
from flexfl.files import atomic_file


def read_choices(path: Path) -> dict[str, Any]:
    """Every table of the file ({} when it does not exist); a ConfigError naming it when it is not valid TOML."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def write_choice(path: Path, keys: Sequence[str], entry: dict[str, Any], *, base: Path | None = None) -> dict[str, Any]:
    """Set the table at `keys` (e.g. ("mnist", "epoch")) to `entry` among the choices of `base` (default:
    `path` itself), write them all to `path` atomically, and return them."""
    path = Path(path)
    chosen = read_choices(path if base is None else base)
    table = chosen
    for key in keys[:-1]:
        table = table.setdefault(key, {})
    table[keys[-1]] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as f:
        tomli_w.dump(chosen, f)
    return chosen
