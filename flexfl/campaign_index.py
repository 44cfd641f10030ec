"""A campaign's folder index (campaign.json), read back typed, and its page (flexfl campaign run; flexfl report).

campaign.json is rewritten after every run: the campaign's name, file and target, and per run its
axis values, its state and (once it ended) the three figures the sweep pages compare (final test
accuracy, mean test accuracy over the last 20 rounds, final test loss) with its rounds, wall time
and problems. The page (campaign.md) groups runs by every axis but the seed and shows each figure
as the median [min, max] over the seeds run, as simulator.paper.strategies_page does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from flexfl.errors import ConfigError
from flexfl.files import atomic_file
from flexfl.markdown import table

SEED_AXIS = "run.seed"  # the axis a campaign's page takes medians over
INDEX_NAME = "campaign.json"
PAGE_NAME = "campaign.md"
RUNS_DIR = "runs"
LAST_ROUNDS = 20  # the sweep pages' "mean test accuracy over the last 20 rounds"
# The figures compared, as the sweep pages name and scale them (simulator.paper.strategies_page.METRICS).
FIGURES = (("final_acc", "final test accuracy (%)", 100.0),
           ("last20_acc", f"mean test accuracy over the last {LAST_ROUNDS} rounds (%)", 100.0),
           ("final_loss", "final test loss", 1.0))


class RunState(StrEnum):
    """Where a campaign's run stands: not started, ended as asked, or ended with problems."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"  # ended, but short of its rounds or without a scripted event (its problems say)


@dataclass(frozen=True)
class RunResult:
    """One run in the index: its place, axis values, state, and figures once it ended."""

    index: int
    name: str
    values: Mapping[str, Any]
    state: RunState = RunState.PENDING
    rounds: int | None = None
    final_acc: float | None = None
    last20_acc: float | None = None
    final_loss: float | None = None
    wall_s: float | None = None  # the session that ended it (a resumed run: since the resume)
    resumed_after_round: int | None = None
    problems: tuple[str, ...] = ()

    def figure(self, key: str) -> float | None:
        return {"final_acc": self.final_acc, "last20_acc": self.last20_acc, "final_loss": self.final_loss}[key]


@dataclass(frozen=True)
class CampaignIndex:
    """campaign.json: the campaign and its runs."""

    name: str
    file: str
    target: str  # "loopback", "emulated fleet" or "fleet <inventory>"
    axes: Mapping[str, Sequence[Any]]
    runs: tuple[RunResult, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        raw = asdict(self)
        raw["runs"] = [{**asdict(r), "state": str(r.state), "problems": list(r.problems)} for r in self.runs]
        return json.dumps(raw, indent=1)

    @classmethod
    def from_json(cls, text: str, *, where: str) -> CampaignIndex:
        try:
            raw = json.loads(text)
            runs = tuple(RunResult(**{**r, "state": RunState(r["state"]), "problems": tuple(r["problems"])})
                         for r in raw.pop("runs"))
            return cls(**raw, runs=runs)
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"{where}: not a campaign index ({type(exc).__name__}: {exc})") from None


def read_index(folder: Path) -> CampaignIndex:
    path = Path(folder) / INDEX_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the campaign index: {exc.strerror}") from None
    return CampaignIndex.from_json(text, where=str(path))


def write_index(folder: Path, index: CampaignIndex) -> None:
    with atomic_file(Path(folder) / INDEX_NAME) as f:
        f.write(index.to_json())


# ---- the page ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """Runs that differ only in their seed: the values they share and their results."""

    values: Mapping[str, Any]
    runs: tuple[RunResult, ...]

    def median_range(self, key: str, scale: float) -> str:
        """The figure's median [min, max] over the runs that ended, with how many ("not run" for none)."""
        figures = [f for r in self.runs if r.state is not RunState.PENDING and (f := r.figure(key)) is not None]
        if not figures:
            return "not run"
        scaled = np.asarray(figures, float) * scale
        digits = 1 if scale != 1.0 else 3
        return (f"{np.median(scaled):.{digits}f} [{scaled.min():.{digits}f}, {scaled.max():.{digits}f}] "
                f"(n={len(scaled)})")


def groups(index: CampaignIndex, *, seed_key: str) -> list[Group]:
    """The runs grouped by every axis value but the seed's, in the campaign's order."""
    found: dict[str, list[RunResult]] = {}
    shared: dict[str, dict[str, Any]] = {}
    for run in index.runs:
        values = {k: v for k, v in run.values.items() if k != seed_key}
        key = json.dumps(values, sort_keys=True, default=str)
        found.setdefault(key, []).append(run)
        shared[key] = values
    return [Group(values=shared[k], runs=tuple(v)) for k, v in found.items()]


def page(index: CampaignIndex, *, seed_key: str) -> str:
    """campaign.md: per figure, one row per group (median [min, max] over seeds), then every run."""
    grouped = groups(index, seed_key=seed_key)
    varied = [k for k in index.axes if k != seed_key]
    done = sum(r.state is not RunState.PENDING for r in index.runs)
    parts = [f"# Campaign {index.name}", "",
             f"{done} of {len(index.runs)} runs ended, on {index.target}; campaign file `{index.file}`. "
             f"Cells: median [min, max] over the seeds run (n: how many).", ""]
    header = [k.rpartition(".")[2] for k in varied] or ["runs"]
    for key, title, scale in FIGURES:
        cells = [[*([str(g.values[k]) for k in varied] or ["all"]), g.median_range(key, scale)] for g in grouped]
        parts += [f"## {title}", "", table([*header, title], cells), ""]
    parts += ["## Runs", "", table(["#", "run", "state", "rounds", "final acc (%)", "wall (s)", "problems"], [
        [str(r.index + 1), f"[{r.name}]({RUNS_DIR}/{r.name}/report.html)", str(r.state),
         "" if r.rounds is None else str(r.rounds), "" if r.final_acc is None else f"{100 * r.final_acc:.1f}",
         "" if r.wall_s is None else f"{r.wall_s:.0f}", "; ".join(r.problems)] for r in index.runs]), ""]
    return "\n".join(parts)


def write_page(folder: Path, index: CampaignIndex, *, seed_key: str) -> Path:
    path = Path(folder) / PAGE_NAME
    with atomic_file(path) as f:
        f.write(page(index, seed_key=seed_key))
    return path
