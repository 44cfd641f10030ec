"""Tables and plots of simulation results: per-round CSVs, the Table 3 layout, accuracy curves."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coordinator.rules.strategies import title_of
from flexfl.files import atomic_file
from flexfl.markdown import table
from simulator.paper_numbers import PAPER_TABLE3


def write_csv_atomic(path: Path, rows: Sequence[dict]) -> None:
    """Write dict rows (same keys) to CSV via a temp file and rename, so readers never see half a file."""
    with atomic_file(path) as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


LOCAL_DIR = "local"  # where a page goes that would drop runs its committed CSV lists


def page_dir(out_dir: Path, runs_csv: str, rows: Sequence[dict], key: Sequence[str], *, replace: bool) -> Path:
    """Where a page and every file beside it (CSV, plots, timing) go: `out_dir`, unless the runs
    CSV there lists runs (by `key`) that `rows` lack - a fresh clone holds the committed pages
    but not the runs behind them, so a small rerun would erase hours of results. Then
    `out_dir`/local, with a warning; `replace` writes over the page anyway. The folder exists
    on return. Every page of results/ asks here (Tables 3-5, the arrivals figures, the
    operating point, the scheme comparison)."""
    import logging

    path = Path(out_dir) / runs_csv
    if replace or not path.is_file():
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return Path(out_dir)
    with open(path, newline="", encoding="utf-8") as f:
        committed = {tuple(r.get(k, "") for k in key) for r in csv.DictReader(f)}
    lost = committed - {tuple(str(r[k]) for k in key) for r in rows}
    if not lost:
        return Path(out_dir)
    local = Path(out_dir) / LOCAL_DIR
    local.mkdir(parents=True, exist_ok=True)
    logging.getLogger(__name__).warning(
        "%s lists %d runs that are not finished here (e.g. %s): the page goes to %s instead of replacing "
        "it; rerun with --replace-page to overwrite", path, len(lost), ", ".join("_".join(x) for x in sorted(lost)[:3]),
        local)
    return local


def write_jsonl_atomic(path: Path, rows: Sequence[dict]) -> None:
    """One JSON object per line (the coordinator's metrics.jsonl format), written atomically."""
    import json

    from coordinator.rules.round_record import clean_json

    with atomic_file(path) as f:
        for row in rows:
            f.write(json.dumps(clean_json(row)) + "\n")


def improvement_pct(new: float, old: float) -> float:
    """% improvement of `new` over `old` (relative): 100 (new - old) / old."""
    return 100.0 * (new - old) / old


@dataclass(frozen=True)
class Cell:
    """One (setting, |T|) cell of Table 3 over seeds."""

    b_over_a: np.ndarray  # per seed
    c_over_b: np.ndarray

    @staticmethod
    def _fmt(v: np.ndarray) -> str:
        if len(v) == 0:
            return "n/a"
        spread = f" ± {np.std(v, ddof=1):.1f}" if len(v) > 1 else ""
        return f"{np.mean(v):.1f}{spread}"

    def parts(self) -> tuple[str, str]:
        """("B over A", "C over B"), each as mean ± sample std over seeds."""
        return self._fmt(self.b_over_a), self._fmt(self.c_over_b)

    def text(self) -> str:
        return ", ".join(self.parts())


LOWER_IS_BETTER = frozenset({"final_loss"})


def table3_cells(final: Iterable[dict], *, metric: str = "final_acc") -> dict[tuple[str, int], Cell]:
    """Group per-run metrics {setting, num_traces, scheme, seed, <metric>} into Table 3 cells.

    Improvements are computed per seed (schemes of one seed share data, traces and s draws),
    then summarised over seeds. For a loss the improvement is the relative reduction,
    100 (old - new) / old, so that positive means better for every metric.
    """
    acc: dict[tuple[str, int, int], dict[str, float]] = defaultdict(dict)
    for r in final:
        acc[(r["setting"], int(r["num_traces"]), int(r["seed"]))][r["scheme"]] = float(r[metric])
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    per_cell: dict[tuple[str, int], tuple[list, list]] = defaultdict(lambda: ([], []))
    for (setting, j, _seed), by_scheme in sorted(acc.items()):
        if {"A", "B", "C"} <= set(by_scheme):
            b_a, c_b = per_cell[(setting, j)]
            b_a.append(sign * improvement_pct(by_scheme["B"], by_scheme["A"]))
            c_b.append(sign * improvement_pct(by_scheme["C"], by_scheme["B"]))
    return {key: Cell(np.array(v[0]), np.array(v[1])) for key, v in per_cell.items()}


def table3_markdown(dataset: str, cells: dict[tuple[str, int], Cell], *, settings: Sequence[str]) -> str:
    """The paper's Table 3 layout: rows per setting (ours, paper), columns |T| = 1..8."""
    rows = []
    for setting in settings:
        label = f"{dataset.upper()} {setting.upper()}"
        ours = [cells[(setting, j)].text() if (setting, j) in cells else "not run" for j in range(1, 9)]
        paper = [f"{a}, {c}" for a, c in PAPER_TABLE3.get((dataset, setting), [])] or ["-"] * 8
        rows += [[f"{label} (FlexFL)", *ours], [f"{label} (paper)", *paper]]
    return table(["data", *(f"\\|T\\|={j}" for j in range(1, 9))], rows)


def plot_accuracy_curves(
    path: Path,
    curves: dict[str, dict[str, np.ndarray]],
    *,
    title: str,
) -> None:
    """One panel per key of `curves` ({panel: {scheme: accuracy per round}}), schemes overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(curves)
    cols = min(4, len(panels))
    rows = (len(panels) + cols - 1) // cols
    size = (6.4, 4.2) if len(panels) == 1 else (3.6 * cols, 2.9 * rows)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, sharey=True)
    styles = {"A": ("tab:blue", "-"), "B": ("tab:orange", "--"), "C": ("tab:green", "-"), "fednova": ("tab:red", "-."),
              "fedprox": ("tab:purple", ":"), "mifa": ("tab:brown", (0, (6, 3)))}  # dashed: it often lies on C
    for ax, panel in zip(axes.flat, panels):
        for scheme, acc in sorted(curves[panel].items()):
            color, ls = styles.get(scheme, (None, "-"))
            ax.plot(np.arange(1, len(acc) + 1), 100 * np.asarray(acc), color=color, linestyle=ls,
                    label=title_of(scheme), lw=1.3)
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy (%)")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
