"""Run a campaign's runs one after another into one folder; rerun, it goes on where it stopped.

The folder: campaign.toml (a copy of the campaign file as it was read), campaign.json and
campaign.md (flexfl.campaign_index), and runs/<run name>/, each a `flexfl live` run folder. The runs' secrets
(their fleet tokens) are kept beside the folder, never in it (it is zipped and shared): in
.<campaign folder name>.secrets/runs/<run name>/ (flexfl.run_folder.secrets_dir). Before each run
its folder says where it stands (plan_run):
- it ended (summary.json) under this run's config (its live.toml): never run again;
- it was interrupted under this config: resumed from its coordinator's checkpoint (flexfl live --resume);
- it holds another config (the campaign file changed) or nothing to continue: started again
  (the earlier folder is moved aside, as --fresh does; nothing is deleted).
Configs are compared as flexfl live saved them (to_dict, paths absolute), the run folder aside.

A target runs one run through flexfl.app.live.LiveRun: on loopback, on the emulated fleet (--emulate,
root), or with only its coordinator here for a fleet of service agents (--fleet, flexfl.app.fleet_file).
Ctrl-C or SIGTERM stops the campaign in its current run, which the next invocation resumes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from coordinator.metrics import read_metrics
from coordinator.resume import CHECKPOINT_NAME
from flexfl.app.campaign.spec import Campaign, CampaignRun
from flexfl.app.live import CONFIG_NAME, LiveConfig, LiveRun, load_live_config
from flexfl.campaign_index import (
    LAST_ROUNDS,
    RUNS_DIR,
    SEED_AXIS,
    CampaignIndex,
    RunResult,
    RunState,
    write_index,
    write_page,
)
from flexfl.config import merged, to_dict
from flexfl.errors import ConfigError
from flexfl.run_folder import claim_run_folder, secrets_dir

CAMPAIGN_COPY = "campaign.toml"


class Plan(StrEnum):
    """What a run's folder says to do with it."""

    SKIP = "done before: not run again"
    RESUME = "interrupted: resumed from its checkpoint"
    START = "started"
    RESTART = "started again (its folder held another config or nothing to continue; moved aside)"


class Target(Protocol):
    """Where a campaign's runs run: one run to its end, its summary returned."""

    @property
    def label(self) -> str:
        """Where, in words ("loopback", "the emulated fleet ...", "the fleet of fleet.toml")."""
        ...

    def settings(self) -> dict[str, Any]:
        """What it sets in every run's config (the tables of a live config)."""
        ...

    def run(self, cfg: LiveConfig, *, resume: bool, fresh: bool, secrets_folder: Path) -> dict:
        """Run `cfg` to its end (resuming its folder's run, or moving an earlier one aside), keeping its secrets
        in `secrets_folder`; its summary."""
        ...


@dataclass(frozen=True)
class LocalTarget:
    """Runs through flexfl live: on loopback, on the emulated fleet (root), or with only the coordinator here for a
    fleet whose agents are their devices' services (a fleet file: flexfl.app.fleet_file)."""

    emulate: bool = False
    fleet: Path | None = None

    @property
    def label(self) -> str:
        if self.fleet is not None:
            return f"the fleet of {self.fleet}"
        return "the emulated fleet (netns, tbf, cgroup quotas)" if self.emulate else "loopback"

    def settings(self) -> dict[str, Any]:
        """What it sets in every run's config."""
        return merged({"emulate": {"enabled": True}} if self.emulate else {},
                      {"fleet": str(Path(self.fleet).resolve())} if self.fleet is not None else {})

    def run(self, cfg: LiveConfig, *, resume: bool, fresh: bool, secrets_folder: Path) -> dict:
        return LiveRun(cfg, resume=resume, fresh=fresh, secrets_folder=secrets_folder).run()


def same_config(a: LiveConfig, b: LiveConfig) -> bool:
    """Two runs' configs mean the same run (the folder they write to aside)."""
    return {**to_dict(a, absolute_paths=True), "out": ""} == {**to_dict(b, absolute_paths=True), "out": ""}


def plan_run(run_dir: Path, cfg: LiveConfig) -> Plan:
    """What to do with a run whose folder is `run_dir` (the module docstring)."""
    saved = run_dir / CONFIG_NAME
    if not run_dir.exists() or not any(p for p in run_dir.iterdir() if p.name != ".lock"):
        return Plan.START
    try:
        same = saved.exists() and same_config(load_live_config(saved), cfg)
    except ConfigError:
        same = False  # a saved config this version cannot read is another config
    if not same:
        return Plan.RESTART
    if (run_dir / "summary.json").exists():
        return Plan.SKIP
    return Plan.RESUME if (run_dir / "coordinator" / CHECKPOINT_NAME).exists() else Plan.RESTART


@dataclass
class CampaignRunner:
    """Runs `campaign` into `out` on `target`; `rerun` is the command that continues it (for messages)."""

    campaign: Campaign
    out: Path
    target: Target
    rerun: str
    report: Callable[[str], None] = print
    after_run: Callable[[Path], None] | None = None  # given each ended run's folder (e.g. to write its report)

    def run(self) -> CampaignIndex:
        """Every run not ended yet, in order; the index and page are rewritten after each."""
        folder = claim_run_folder(self.out, what="flexfl campaign", holds_run=lambda _: None)
        try:
            shutil.copyfile(self.campaign.path, self.out / CAMPAIGN_COPY)
            index = self._index()
            started = time.monotonic()
            for run in self.campaign.runs:
                index = self._one(index, run)
            self.report(f"campaign {self.campaign.name}: {len(index.runs)} runs ended "
                        f"({time.monotonic() - started:.0f} s this session); results in {self.out}")
            return index
        finally:
            folder.release()

    def _index(self) -> CampaignIndex:
        return CampaignIndex(name=self.campaign.name, file=str(self.campaign.path.resolve()), target=self.target.label,
                             axes={a.key: list(a.values) for a in self.campaign.axes},
                             runs=tuple(RunResult(index=r.index, name=r.name, values=dict(r.values))
                                        for r in self.campaign.runs))

    def _one(self, index: CampaignIndex, run: CampaignRun) -> CampaignIndex:
        run_dir = self.out / RUNS_DIR / run.name
        cfg = self.campaign.config(run, out=run_dir, settings=self.target.settings())
        plan = plan_run(run_dir, cfg)
        n = len(self.campaign.runs)
        self.report(f"campaign {self.campaign.name}: run {run.index + 1} of {n} ({run.name}): {plan}")
        if plan is not Plan.SKIP:
            try:
                self.target.run(cfg, resume=plan is Plan.RESUME, fresh=plan is Plan.RESTART,
                                secrets_folder=secrets_dir(run_dir, within=self.out))
            except KeyboardInterrupt:
                raise KeyboardInterrupt(f"campaign {self.campaign.name} stopped in run {run.index + 1} of {n} "
                                        f"({run.name}); `{self.rerun}` continues it (runs that ended are not "
                                        "run again)") from None
        summary = _read_summary(run_dir)
        if plan is not Plan.SKIP and self.after_run is not None:
            self.after_run(run_dir)
        result = run_result(run.index, run.name, dict(run.values), run_dir, summary)
        if result.state is RunState.FAILED:
            self.report(f"campaign {self.campaign.name}: run {run.index + 1} ({run.name}) ended with problems: "
                        + "; ".join(result.problems))
        index = replace(index, runs=tuple(result if r.index == run.index else r for r in index.runs))
        write_index(self.out, index)
        write_page(self.out, index, seed_key=SEED_AXIS)
        return index


def _read_summary(run_dir: Path) -> dict:
    import json

    path = run_dir / "summary.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: the run's summary is missing or unreadable ({exc})") from None


def run_result(index: int, name: str, values: Mapping[str, Any], run_dir: Path,
               summary: Mapping[str, Any]) -> RunResult:
    """A run's entry from its folder: the summary flexfl live wrote and its coordinator's rows."""
    rows = read_metrics(Path(run_dir) / "coordinator" / "metrics.jsonl")
    last = [r.test_acc for r in rows[-LAST_ROUNDS:]]
    problems = tuple(summary.get("problems", ()))
    return RunResult(index=index, name=name, values=values, state=RunState.FAILED if problems else RunState.DONE,
                     rounds=len(rows), final_acc=rows[-1].test_acc if rows else None,
                     last20_acc=float(np.mean(last)) if last else None,
                     final_loss=rows[-1].test_loss if rows else None, wall_s=summary.get("wall_s"),
                     resumed_after_round=summary.get("resumed_after_round"), problems=problems)
