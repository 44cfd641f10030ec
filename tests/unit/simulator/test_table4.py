"""Table 4's page from hand-made recoveries: the paper's rule, the no-restart diagnostic, the page from its CSVs."""

from __future__ import annotations

import json

from simulator.paper import table4
from simulator.paper.regime import Regime
from simulator.paper.table4 import (
    DIAGNOSTIC_CSV,
    METRICS,
    TAU0,
    DatasetResult,
    Recoveries,
    groups,
    page_from_csv,
    render,
)


def _found(rounds: int) -> tuple[Recoveries, ...]:
    return tuple(Recoveries(tau0=t, seed=s, reboot=rb, rounds=dict.fromkeys(METRICS, rounds + (rb == "vanilla")))
                 for t in TAU0 for s in (0, 1) for rb in ("fast", "vanilla"))


def test_the_diagnostic_runs_keep_the_rate_and_are_named_apart() -> None:
    paper = [r for g in groups("synthetic", seeds=[0], tau0s=[30]) for r in g.runs]
    diagnostic = [r for g in groups("synthetic", seeds=[0], tau0s=[30], lr_restart=False) for r in g.runs]
    assert [r.name for r in diagnostic] == ["synthetic_tau30_seed0_fast_no-restart",
                                            "synthetic_tau30_seed0_vanilla_no-restart"]
    assert {r.config.rules.lr_restart for r in paper} == {True}
    assert {r.config.rules.lr_restart for r in diagnostic} == {False}
    assert [r.labels for r in diagnostic] == [r.labels for r in paper]


def test_the_page_shows_the_diagnostic_apart_labelled_not_the_papers_rule() -> None:
    """Issue 33 item 12: the restart's effect shown as a diagnostic row, not in place of the paper's rule."""
    plain = render([DatasetResult(dataset="synthetic", found=_found(27), plot="p.png")], timing={}, regimes="r",
                   note="n")
    assert "Diagnostic" not in plain
    page = render([DatasetResult(dataset="synthetic", found=_found(27), no_restart=_found(4), plot="p.png")],
                  timing={}, regimes="r", note="n")
    head, diagnostic = page.split("#### Diagnostic, not the paper's rule: no learning-rate restart after the arrival")
    assert "| FlexFL acc/old | 27 [27, 27] \\| 28 [28, 28]; fast sooner in 2/2 |" in head
    assert "| no restart acc/old | 4 [4, 4] \\| 5 [5, 5]; fast sooner in 2/2 |" in diagnostic
    assert "| paper's rule acc/old | 27 [27, 27] \\| 28 [28, 28]; fast sooner in 2/2 |" in diagnostic
    assert "on 2 seeds ([0, 1])" in diagnostic
    assert "`lr_restart = false`" in diagnostic and f"`{DIAGNOSTIC_CSV}`" in diagnostic


def test_the_page_renders_again_from_its_csvs(tmp_path, monkeypatch) -> None:
    """write_page from runs and page_from_csv from the CSVs it wrote give the same page."""
    found, no_restart = list(_found(9)), list(_found(3))
    monkeypatch.setattr(table4, "collect", lambda dataset, *, lr_restart=True, **kw: found if lr_restart
                        else no_restart)
    monkeypatch.setattr(table4, "_plot", lambda *a, **k: None)
    path = table4.write_page(tmp_path, work_dirs={"synthetic": tmp_path}, seeds=[0, 1], timing={"c": "1 min for `c`"})
    (tmp_path / "table4_timing.json").write_text(json.dumps({"c": "1 min for `c`"}))
    first = path.read_text()
    assert (tmp_path / DIAGNOSTIC_CSV).is_file() and "no restart loss/old" in first
    assert page_from_csv(tmp_path, regime=Regime()).read_text() == first


def test_recoveries_read_back_from_the_runs_csv_with_never_as_none(tmp_path) -> None:
    """A Recoveries record through table4_runs.csv and back (table4._read_recoveries); a bad cell names
    the file, line and the metrics' columns."""
    import pytest

    from flexfl.errors import ReportError
    from simulator.report import write_csv_atomic

    found = (Recoveries(tau0=10, seed=0, reboot="fast", rounds={"acc/old": 3, "acc/new": None, "loss/old": 7}),
             Recoveries(tau0=10, seed=1, reboot="vanilla", rounds=dict.fromkeys(METRICS, None)))
    path = tmp_path / "table4_runs.csv"
    write_csv_atomic(path, DatasetResult(dataset="mnist", found=found).rows(found))
    assert table4._read_recoveries(path) == {"mnist": list(found)}
    path.write_text(path.read_text().replace(",never,", ",soon,", 1))
    with pytest.raises(ReportError, match=r"table4_runs\.csv:2: columns 'acc/old', 'acc/new', 'loss/old': expected a "
                                          r"round count or 'never' per metric, got \('3', 'soon', '7'\)"):
        table4._read_recoveries(path)
