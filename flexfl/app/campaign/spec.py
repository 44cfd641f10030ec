"""A campaign file: a base run and the axes to vary, read into the list of runs it stands for.

    [campaign]
    name = "strategies"            # the folder's default name: out/campaigns/<name>
    base = "live.toml"             # optional: a `flexfl live` config file (relative to this file)

    [base.run]                     # optional: the same tables and keys, here (they win over `base`)
    rounds = 12
    [base.partition]
    dataset = "synthetic"
    n_devices = 4

    [axes]                         # dotted keys of that config: each run takes one value of each
    "rules.strategy" = ["scheme-c", "fednova"]
    "run.seed" = [0, 1, 2]

The runs are the product of the axes, the first axis outermost (here scheme-c with seeds 0, 1, 2,
then fednova with seeds 0, 1, 2). Each run is a `flexfl live` config built by load_live_config, so a
campaign's base means what the same tables mean in a `flexfl live --config` file; relative paths
in [base] and in axis values are relative to the campaign file. Every run's config is built and
checked when the file is read: a bad value fails before anything runs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexfl.app.live import LiveConfig, load_live_config
from flexfl.config import file_relative, merged, read_toml
from flexfl.errors import ConfigError

TABLES = ("campaign", "base", "axes")
CAMPAIGN_KEYS = ("name", "base")


@dataclass(frozen=True)
class Axis:
    """One varied key: its dotted path into the live config and the values it takes, in order."""

    key: str
    values: tuple[Any, ...]

    @property
    def label(self) -> str:
        """The key's last part (rules.strategy -> strategy): what run names and the page show."""
        return self.key.rpartition(".")[2]


@dataclass(frozen=True)
class CampaignRun:
    """One run of the campaign: its name (its folder's), the axis values it takes, and its config."""

    index: int  # 0-based, in the campaign's order
    name: str
    values: Mapping[str, Any]  # axis key -> value
    overrides: Mapping[str, Any]  # the nested tables these values set


@dataclass(frozen=True)
class Campaign:
    """A read campaign file: where it is, its name, its base and axes, and its runs."""

    path: Path
    name: str
    base_file: Path | None
    base: Mapping[str, Any]  # [base], paths made relative to the campaign file
    axes: tuple[Axis, ...]
    runs: tuple[CampaignRun, ...]

    def config(self, run: CampaignRun, *, out: Path, settings: Mapping[str, Any] | None = None) -> LiveConfig:
        """The run's `flexfl live` config: base file < [base] < the run's axis values < its folder and the target's
        `settings` (--emulate, --fleet)."""
        overrides = merged(self.base, run.overrides, {"out": str(out)}, settings or {})
        try:
            return load_live_config(self.base_file, overrides=overrides)
        except ConfigError as exc:
            raise ConfigError(f"{self.path}: run {run.index + 1} ({run.name}): {exc}") from None


def read_campaign(path: Path) -> Campaign:
    """Read and check a campaign file; every run's config is built once, so a bad value fails here."""
    path = Path(path)
    raw = read_toml(path)
    unknown = sorted(set(raw) - set(TABLES))
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(unknown)}; a campaign has [campaign], [base] and "
                          "[axes]")
    head = _table(raw, "campaign", path)
    if bad := sorted(set(head) - set(CAMPAIGN_KEYS)):
        raise ConfigError(f"{path}: [campaign] has unknown key(s) {', '.join(bad)}; it takes "
                          f"{', '.join(CAMPAIGN_KEYS)}")
    name = head.get("name") or path.stem
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(f"{path}: [campaign] name must be letters, digits, '.', '_' or '-', got {name!r}")
    base_file = None
    if "base" in head:
        base_file = (path.parent / str(head["base"])).resolve()
        if not base_file.is_file():
            raise ConfigError(f"{path}: [campaign] base = {head['base']!r}: no such file {base_file}")
    base = file_relative(LiveConfig, _table(raw, "base", path), path.parent)
    axes = _axes(_table(raw, "axes", path), path)
    campaign = Campaign(path=path, name=name, base_file=base_file, base=base, axes=axes, runs=_runs(axes, path))
    for run in campaign.runs:
        campaign.config(run, out=Path("out") / "check")
    return campaign


def _table(raw: Mapping[str, Any], name: str, path: Path) -> dict[str, Any]:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {name} must be a table ([{name}]), got {value!r}")
    return value


def _axes(raw: Mapping[str, Any], path: Path) -> tuple[Axis, ...]:
    axes = []
    for key, values in _flat(raw):
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: [axes] {key} must be a non-empty list of values, got {values!r}")
        if key in ("out", "fleet", "emulate.enabled"):
            raise ConfigError(f"{path}: [axes] {key} is set by the campaign itself (its folder, --emulate, --fleet)")
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"{path}: [axes] {key} repeats a value: {values!r}")
        axes.append(Axis(key=key, values=tuple(values)))
    labels = [a.label for a in axes]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{path}: [axes] two keys end in the same name ({', '.join(labels)}); run names need "
                          "them apart")
    return tuple(axes)


def _flat(raw: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted keys of nested tables: {"rules": {"strategy": [...]}} and {"rules.strategy": [...]} alike."""
    out = []
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _flat(value, dotted + ".")
        else:
            out.append((dotted, value))
    return out


def _runs(axes: Sequence[Axis], path: Path) -> tuple[CampaignRun, ...]:
    runs = []
    for index, combo in enumerate(itertools.product(*(a.values for a in axes))):
        values = {a.key: v for a, v in zip(axes, combo)}
        name = "__".join(f"{a.label}-{_slug(v)}" for a, v in zip(axes, combo)) or "run"
        overrides: dict[str, Any] = {}
        for key, value in values.items():
            _merge_into(overrides, key.split("."), file_relative_value(key, value, path))
        runs.append(CampaignRun(index=index, name=name, values=values, overrides=overrides))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: [axes] values that read alike give two runs one name ({names}); make them differ")
    return tuple(runs)


def file_relative_value(key: str, value: Any, path: Path) -> Any:
    """An axis value as [base] would hold it: a path field's relative value is relative to the campaign file."""
    nested: dict[str, Any] = {}
    parts = key.split(".")
    _merge_into(nested, parts, value)
    resolved: Any = file_relative(LiveConfig, nested, path.parent)
    for part in parts:
        resolved = resolved[part]
    return resolved


def _merge_into(tables: dict[str, Any], parts: Sequence[str], value: Any) -> None:
    for part in parts[:-1]:
        tables = tables.setdefault(part, {})
    tables[parts[-1]] = value


def _slug(value: Any) -> str:
    """A folder-safe short form of an axis value: a path's stem, a table's name, else its text."""
    if isinstance(value, dict):
        value = value.get("name", "-".join(f"{k}{v}" for k, v in value.items()))
    text = str(value)
    if "/" in text:
        text = Path(text).stem
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"
