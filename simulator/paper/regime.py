"""An experiment's regime: what one local update is (E's unit) and which eta_0 it runs at.

Every paper experiment (simulator.paper.table3, table4, table5, figure_arrivals) builds its runs
without choosing either; the sweep commands apply one Regime to all of them
(`--unit step|epoch --eta0 default|paper|protocol|NUMBER`; each module's groups() take it), so the choice is made in one
place and named in the page and the work folder.

eta_0 sources:
- paper:    the paper's value for the dataset (2e-3 MNIST, 5e-4 EMNIST, 1 SYNTHETIC);
- protocol: the value the operating-point protocol chose for (dataset, unit), read from
            results/operating_point.toml (`flexfl sim operating-point`, simulator.paper.operating_point);
            the protocol never looks at the comparison it serves;
- default:  the paper's value, except MNIST under the step reading: 0.1, the value the step
            reading's pages were run at before the protocol existed (results/README.md);
- a number: that value, for every dataset of the sweep.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from flexfl.config import enum_choices
from flexfl.errors import ConfigError
from flexfl.vocabulary import Unit
from simulator.paper.choices_file import read_choices
from workloads.defaults import default_eta0
from workloads.partition_spec import Dataset

if TYPE_CHECKING:  # the simulator's engine imports torch; `flexfl ... --help` builds this module's flags
    from simulator.engine import SimConfig

OPERATING_POINT_FILE = Path(__file__).resolve().parents[2] / "results" / "operating_point.toml"  # the checkout's
SOURCES = ("default", "paper", "protocol")


# Which reading of E agrees best with each of the paper's tables, and why the other does not:
# results/README.md, "Which reading reproduces which table" (the figures behind each are there).
BEST_READING = {
    "Table 3": (Unit.EPOCH, "E in epochs at the paper's eta_0 (results/epoch-paper/)",
                "in steps fewer cells have the paper's sign and rank for Scheme B over A"),
    "Table 4": (Unit.STEP, "E in steps (results/)",
                "in epochs the paper's learning-rate restart after an arrival (eta_0 / (tau - tau_0)) makes "
                "recovery take about tau_0 rounds with or without fast-reboot"),
    "Table 5": (Unit.STEP, "E in steps (results/)",
                "in epochs the same learning-rate restart follows a departure, and exclude's loss crosses "
                "include's later than in the paper"),
}
WHICH_READING = 'results/README.md, "Which reading reproduces which table"'


@dataclass(frozen=True)
class Regime:
    unit: Unit = Unit.STEP
    eta0: str = "default"  # one of SOURCES, or a number as text
    table: Path = OPERATING_POINT_FILE  # where "protocol" looks

    def __post_init__(self) -> None:
        object.__setattr__(self, "unit", Unit(self.unit))
        if self.eta0 not in SOURCES:
            try:
                value = float(self.eta0)
            except ValueError:
                raise ConfigError(f"--eta0 {self.eta0!r}: expected {', '.join(SOURCES)} or a positive number") from None
            if not value > 0:
                raise ConfigError(f"--eta0 {self.eta0!r}: must be > 0")

    @property
    def is_default(self) -> bool:
        return self.unit is Unit.STEP and self.eta0 == "default"

    @property
    def tag(self) -> str:
        """Names the regime's results folder: results/<tag>/ (the default regime writes to results/)."""
        return f"{self.unit}-{self.eta0 if self.eta0 in SOURCES else 'eta0=' + self.eta0}"

    def eta0_for(self, dataset: Dataset | str) -> float | None:
        """The rules' eta0 for `dataset` (None: the rules' default, the paper's value)."""
        from workloads.federated import DEFAULTS

        dataset = Dataset(dataset)
        if self.eta0 == "paper":
            return DEFAULTS[dataset].eta0
        if self.eta0 == "default":
            # None where the default is the paper's value: the configs of runs saved so far say so
            # (an explicit number would make them new runs: simulator.sim_config.runs_alike).
            value = default_eta0(dataset, self.unit)
            return None if value == DEFAULTS[dataset].eta0 else value
        if self.eta0 == "protocol":
            return protocol_eta0(dataset, self.unit, table=self.table)
        return float(self.eta0)

    def apply(self, cfg: SimConfig) -> SimConfig:
        rules = replace(cfg.rules, unit=self.unit, eta0=self.eta0_for(cfg.partition.dataset))
        return replace(cfg, rules=rules)

    def reading_note(self, paper_figure: str) -> str:
        """Which reading of E this is, and which reading agrees best with `paper_figure` ("Table 3",
        "Table 4", "Table 5"; another name, e.g. "Figure 6", has no verdict), from BEST_READING."""
        if self.unit is Unit.EPOCH:
            text = ("the paper's own reading: its text speaks of local epochs throughout, and its learning rates "
                    "(2e-3 MNIST, 1 SYNTHETIC) train in this reading; only a footnote makes epochs and local "
                    "updates interchangeable")
        else:
            text = ("the footnote's reading, one local update = one SGD step, at 1/60 of the epoch reading's compute "
                    "on MNIST; the epoch reading (results/epoch-*/) is the paper's own")
        if paper_figure not in BEST_READING:
            return f"{text}; results/README.md compares the readings on Tables 3-5, not on {paper_figure}"
        unit, best, why_not_other = BEST_READING[paper_figure]
        because = "" if unit is self.unit else f": {why_not_other}"
        return f"{text}. For {paper_figure}, {best} agrees best with the paper{because} ({WHICH_READING})"

    def describe(self, dataset: Dataset | str) -> str:
        from workloads.federated import DEFAULTS

        eta0 = self.eta0_for(dataset)
        eta0 = DEFAULTS[Dataset(dataset)].eta0 if eta0 is None else eta0
        source = {"paper": "the paper's", "protocol": "the operating-point protocol's choice",
                  "default": "the step reading's pre-protocol value" if Dataset(dataset) is Dataset.MNIST
                  and self.unit is Unit.STEP else "the paper's"}.get(self.eta0, "given on the command line")
        return f"E counted in {self.unit}s, eta_0 = {eta0:g} ({source})"


def protocol_eta0(dataset: Dataset | str, unit: Unit | str, *, table: Path = OPERATING_POINT_FILE) -> float:
    """The eta_0 the operating-point protocol chose for (dataset, unit); a clear error if it has not run."""
    key = f"{Dataset(dataset)}.{Unit(unit)}"
    hint = f"run `flexfl sim operating-point --dataset {Dataset(dataset)} --unit {Unit(unit)}` first"
    if not table.exists():
        raise ConfigError(f"--eta0 protocol: {table} does not exist; {hint}")
    entry = read_choices(table).get(str(Dataset(dataset)), {}).get(str(Unit(unit)))
    if not isinstance(entry, dict) or not isinstance(entry.get("eta0"), (int, float)):
        raise ConfigError(f"--eta0 protocol: {table} has no [{key}] eta0; {hint}")
    return float(entry["eta0"])


def add_regime_flags(p: argparse.ArgumentParser, *, unit: str = "step", eta0: str = "default") -> None:
    p.add_argument("--unit", default=unit, choices=enum_choices(Unit),
                   help="what one of the E = 20 local updates is: an SGD step or an epoch over the device's data "
                        f"(ceil(n_k / B) steps) (default {unit})")
    p.add_argument("--eta0", default=eta0,
                   help="eta_0: paper, protocol (results/operating_point.toml, `flexfl sim operating-point`), a "
                        f"number, or default (the paper's, but 0.1 for MNIST under --unit step) (default {eta0})")


def regime_from_args(args: argparse.Namespace) -> Regime:
    try:
        unit = Unit(args.unit)
    except ValueError:
        raise ConfigError(f"--unit {args.unit!r}: expected {' or '.join(str(u) for u in Unit)}") from None
    return Regime(unit=unit, eta0=args.eta0)


def out_dir(args: argparse.Namespace, regime: Regime) -> Path:
    """--out if given; else results/ for the default regime and results/<tag>/ for any other."""
    if args.out is not None:
        return args.out
    return Path("results") if regime.is_default else Path("results") / regime.tag
