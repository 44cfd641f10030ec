"""A small rerun never changes a committed page (simulator.report.page_dir), for every page of results/.

Each test makes the "committed" page with a full run into a tmp folder, then runs a smaller
command there (as on a fresh clone, where the runs behind a page are not on disk): every
file of the committed page stays byte-identical and the command says where it wrote instead.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest

from flexfl.app.cli import main


def _page_files(folder: Path) -> dict[str, bytes]:
    """Every file directly in `folder` (the page, its CSV, plots, timing), by name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _add_row(path: Path, **changes) -> None:
    """Append a copy of the CSV's first row with `changes`: a run the committed page has and this checkout lacks."""
    rows = list(csv.DictReader(open(path, newline="")))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([*rows, {**rows[0], **changes}])


def _diverted(caplog, capsys, out: Path, page: str) -> None:
    """The command printed the page's path under <out>/local and warned why."""
    printed = capsys.readouterr().out
    assert str(out / "local" / page) in printed, printed
    assert any("--replace-page" in r.getMessage() and str(out / "local") in r.getMessage() for r in caplog.records)
    assert (out / "local" / page).is_file()


def test_a_small_table5_run_leaves_the_committed_page(tmp_path, monkeypatch, caplog, capsys):
    from simulator.paper import (
        table5,  # Hand-made departures (the real grid is 81 runs of 200 rounds per seed): the page's code is real.
    )
    def dep(seed, tau0):
        include = {r: 1.0 for r in range(1, table5.ROUNDS + 1)}
        exclude = {r: 1.5 if r < tau0 + 10 else 0.9 for r in range(1, table5.ROUNDS + 1)}
        return table5.Departure(ab=(1.0, 1.0), tau0=tau0, seed=seed, include=include, exclude=exclude,
                                include_active=include, gamma=1.0, auto_choice="exclude")

    monkeypatch.setattr(table5, "collect", lambda *, seeds, work_dir, regime: [dep(s, t) for s in seeds
                                                                               for t in (10, 20)])
    out = tmp_path / "results"
    out.mkdir()
    base = ["sim", "table5", "--report-only", "--out", str(out)]
    assert main([*base, "--seeds", "0-4"]) == 0
    committed = _page_files(out)
    assert {"table5.md", "table5_runs.csv", "table5_losses.png"} <= set(committed)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert main([*base, "--seeds", "0"]) == 0
    assert _page_files(out) == committed
    _diverted(caplog, capsys, out, "table5.md")
    assert main([*base, "--seeds", "0", "--replace-page"]) == 0
    assert (out / "table5.md").read_bytes() != committed["table5.md"]


def test_a_small_arrivals_figure_run_leaves_the_committed_page(tmp_path, monkeypatch, caplog, capsys):
    from simulator.paper import figure_arrivals
    monkeypatch.setattr(figure_arrivals, "ROUNDS", 50)  # real runs, shortened
    monkeypatch.setattr(figure_arrivals, "FIRST_ROUNDS", (10, 20, 30))
    out = tmp_path / "results"
    base = ["sim", "arrivals-figure", "--dataset", "synthetic", "--jobs", "1", "--out", str(out)]
    assert main([*base, "--seeds", "0-1"]) == 0
    committed = _page_files(out)
    assert {"figure_arrivals_synthetic.md", "figure_arrivals_synthetic.png", "figure_arrivals_synthetic_runs.csv",
            "figure_arrivals_synthetic_timing.json"} <= set(committed)
    # The same command again computes nothing: its wall time stays the one that computed the runs.
    assert main([*base, "--seeds", "0-1"]) == 0
    assert _page_files(out) == committed
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert main([*base, "--seeds", "0"]) == 0
    assert _page_files(out) == committed
    _diverted(caplog, capsys, out, "figure_arrivals_synthetic.md")


def test_an_operating_point_rerun_leaves_the_committed_choice(tmp_path, monkeypatch, caplog, capsys):
    from simulator.paper import operating_point
    monkeypatch.setattr(operating_point, "ROUNDS", 10)  # real runs of a smaller protocol
    monkeypatch.setattr(operating_point, "GRID_K", (-1, 0, 1))
    monkeypatch.setattr(operating_point, "PROTOCOL_SEEDS", {"synthetic": (100,)})
    out = tmp_path / "results"
    base = ["sim", "operating-point", "--dataset", "synthetic", "--unit", "step", "--jobs", "1", "--out", str(out)]
    assert main(base) == 0
    committed = _page_files(out)
    assert {"operating_point.md", "operating_point.toml", "operating_point_runs.csv"} <= set(committed)
    assert main(base) == 0  # every run cached: the choice, its wall time and the page stay as they are
    assert _page_files(out) == committed
    _add_row(out / "operating_point_runs.csv", k="7")  # a grid point the committed page has and this run lacks
    committed = _page_files(out)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert main(base) == 0
    assert _page_files(out) == committed
    _diverted(caplog, capsys, out, "operating_point.md")


def test_a_small_schemes_run_leaves_the_committed_page(tmp_path, caplog, capsys):
    out = tmp_path / "results"
    base = ["sim", "schemes", "--dataset", "synthetic", "--settings", "iid", "--num-traces-list", "1", "--rounds", "5",
            "--jobs", "1", "--out", str(out)]
    assert main([*base, "--seeds", "0,1"]) == 0
    committed = _page_files(out)
    assert {"schemes_synthetic.md", "schemes_synthetic_final.csv", "schemes_synthetic_iid.png"} <= set(committed)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert main([*base, "--seeds", "0"]) == 0
    assert _page_files(out) == committed
    _diverted(caplog, capsys, out, "schemes_synthetic.md")


@pytest.mark.parametrize("table", ["table3", "table4"])
def test_a_small_computing_run_leaves_the_committed_wall_time(tmp_path, monkeypatch, caplog, capsys, table):
    from simulator.paper import table4
    monkeypatch.setattr(table4, "ROUNDS", 80)  # every tau_0 (up to 70) still arrives
    out = tmp_path / "results"
    base = {"table3": ["sim", "table3", "--dataset", "synthetic", "--readings", "per-label", "--settings", "iid",
                       "--num-traces-list", "1"],
            "table4": ["sim", "table4", "--datasets", "synthetic"]}[table] + ["--jobs", "1", "--out", str(out)]
    assert main([*base, "--seeds", "0"]) == 0
    committed = _page_files(out)
    assert f"{table}_timing.json" in committed
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert main([*base, "--seeds", "1"]) == 0  # computes seed 1; the page would lose seed 0
    # Not compared: table3_plan.json, which records what each computing command asked for
    # before it runs (so that an interrupted sweep's page can say what remains).
    assert {k: v for k, v in _page_files(out).items() if k != "table3_plan.json"} == \
        {k: v for k, v in committed.items() if k != "table3_plan.json"}
    _diverted(caplog, capsys, out, f"{table}.md")
    assert (out / "local" / f"{table}_timing.json").is_file()
