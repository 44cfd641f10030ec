"""Table 5's analysis on hand-made departures: the threshold rule, and auto vs threshold leave-one-seed-out."""

import pytest

from flexfl.errors import ConfigError
from simulator.paper.table5 import ROUNDS, Departure, choose_k, leave_one_seed_out, loso_section, threshold_accuracy


def _dep(gamma, *, crossing_after, seed, tau0=20):
    """Exclude is worse for `crossing_after` rounds after tau0, then better."""
    include = {r: 1.0 for r in range(1, ROUNDS + 1)}
    exclude = {r: (1.5 if tau0 < r < tau0 + crossing_after else 0.9) for r in range(1, ROUNDS + 1)}
    return Departure(ab=(1.0, 1.0), tau0=tau0, seed=seed, include=include, exclude=exclude, include_active=include,
                     gamma=gamma, auto_choice="exclude")


def _grid(seeds=(0, 1, 2)):
    """Per seed an IID departure (exclude pays off after 5 rounds) and a non-IID one (after 80).

    Horizons 2, 5, 10, 20, 40, 80, 150. With tau_0 = 20, auto (exclude iff T - tau_0 >=
    c sqrt(20 Gamma)) is right everywhere for c in (4.47, 8.94]; no single k is: k = 5 is
    wrong for the non-IID device at 5-40, k = 80 for the IID one at 5-40 (10 of 14 right).
    """
    return [d for s in seeds for d in (_dep(0.01, crossing_after=5, seed=s), _dep(4.0, crossing_after=80, seed=s))]


def test_the_threshold_rule_and_its_k():
    deps = _grid(seeds=(0,))
    assert threshold_accuracy(deps, 5) == pytest.approx(10 / 14)
    assert threshold_accuracy(deps, 80) == pytest.approx(10 / 14)
    assert threshold_accuracy(deps, 20) == pytest.approx(10 / 14)  # every k from 5 to 80 ties
    assert threshold_accuracy(deps, ROUNDS) == pytest.approx(6 / 14)  # never exclude
    assert choose_k(deps) == (5.0, pytest.approx(10 / 14))  # the smallest of equals
    assert choose_k([_dep(0.01, crossing_after=5, seed=0)]) == (5.0, 1.0)


def test_leave_one_seed_out_chooses_on_the_other_seeds_and_scores_the_held_out_one():
    deps = _grid()
    # Seed 2's IID device pays off only after 20 rounds. Trained on with seed 0 or 1, it makes
    # k = 20 the best threshold (22 of 28 cases) and leaves c where it was (26 of 28); held
    # out, both rules exclude it too early (at 5 and 10).
    deps[-2] = _dep(0.01, crossing_after=20, seed=2)
    folds = leave_one_seed_out(deps)
    assert [f.seed for f in folds] == [0, 1, 2]
    assert all(4.47 < f.c <= 8.94 for f in folds) and [f.k for f in folds] == [20.0, 20.0, 5.0]
    assert [f.auto for f in folds] == [1.0, 1.0, pytest.approx(12 / 14)]
    assert [f.threshold for f in folds] == [pytest.approx(10 / 14)] * 2 + [pytest.approx(8 / 14)]
    assert folds[0].include == pytest.approx(6 / 14) and folds[0].exclude == pytest.approx(8 / 14)
    with pytest.raises(ConfigError, match="two seeds or more"):
        leave_one_seed_out(_grid(seeds=(0,)))


def test_the_page_section_gives_each_fold_and_the_mean():
    text = loso_section(_grid())
    assert text.startswith("## auto vs threshold, leave-one-seed-out")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == ["| 0 | 5.6234 | 100.0% | 5 | 71.4% | 42.9% | 57.1% |",
                        "| 1 | 5.6234 | 100.0% | 5 | 71.4% | 42.9% | 57.1% |",
                        "| 2 | 5.6234 | 100.0% | 5 | 71.4% | 42.9% | 57.1% |",
                        "| mean | | **100.0%** | | **71.4%** | 42.9% | 57.1% |"]
    assert "auto, which knows Gamma_l, beats the threshold rule" in text
    # When every device pays off after 5 rounds, k = 5 is always right and no c is (the
    # non-IID device's Gamma makes auto wait): the page says so.
    same = [_dep(g, crossing_after=5, seed=s) for s in (0, 1) for g in (0.01, 4.0)]
    assert "auto does no better than the threshold rule" in loso_section(same)


def test_write_page_puts_the_section_on_the_table5_page(tmp_path, monkeypatch):
    import simulator.paper.table5 as table5

    deps = [d for s in (3, 4) for d in (_dep(0.01, crossing_after=5, seed=s), _dep(4.0, crossing_after=80, seed=s))]
    monkeypatch.setattr(table5, "collect", lambda *, seeds, work_dir, regime: deps)
    path, _, _ = table5.write_page(tmp_path, work_dir=tmp_path, seeds=(3, 4), timing="1 min")
    page = path.read_text()
    assert "## auto vs threshold, leave-one-seed-out" in page
    assert "| 3 | 5.6234 | 100.0% | 5 | 71.4% |" in page and "| mean | | **100.0%** | | **71.4%** |" in page


def test_the_page_of_tuning_seeds_only_says_it_is_not_evaluated_yet(tmp_path, monkeypatch):
    from simulator.paper import table5
    monkeypatch.setattr(table5, "collect", lambda **kw: _grid(seeds=(0,)))
    path, c, held = table5.write_page(tmp_path, work_dir=tmp_path, seeds=[0], timing="t")
    page = path.read_text()
    assert "Not evaluated yet: no seed outside the tuning seeds (0, 1 and 2) has finished" in page
    assert "nan" not in page and held != held  # NaN: nothing held out
    monkeypatch.setattr(table5, "collect", lambda **kw: _grid(seeds=(3, 4)))
    path, c, held = table5.write_page(tmp_path, work_dir=tmp_path, seeds=[3, 4], timing="t")
    page = path.read_text()
    assert "c not chosen: none of the tuning seeds (0, 1 and 2) has finished here." in page
    assert "nan" not in page and c != c


def test_a_page_from_one_seed_names_the_seed_it_tuned_on_and_no_constant_names(tmp_path, monkeypatch):
    """Issue 33 item 13: the page said "c chosen on seeds [0, 1, 2]" from seed 0 alone, and printed
    TUNE_SEEDS, HORIZONS, C_GRID and AUTO_C (in the wrong module) as prose."""
    from simulator.paper import table5
    monkeypatch.setattr(table5, "collect", lambda **kw: _grid(seeds=(0,)))
    page = table5.write_page(tmp_path, work_dir=tmp_path, seeds=[0], timing="t")[0].read_text()
    assert "- c chosen on seed 0 (of 33 values log-spaced from 0.01 to 100)" in page
    assert "the other tuning seeds 1 and 2 have not finished here" in page
    assert "chosen on seeds 0, 1 and 2 of this" in page and "T - tau_0 in {2, 5, 10, 20, 40, 80, 150}" in page
    assert "the default `rules.auto_c` is 4.217 (AUTO_C in coordinator/rules/config.py)" in page
    for name in ("TUNE_SEEDS", "HORIZONS", "C_GRID", "round.py"):
        assert name not in page, name


def _never(*, seed, tau0=20):
    """Exclude stays worse than include to the end of the run: it never crosses."""
    return Departure(ab=(1.0, 1.0), tau0=tau0, seed=seed, include=dict.fromkeys(range(1, ROUNDS + 1), 1.0),
                     exclude=dict.fromkeys(range(1, ROUNDS + 1), 1.5), include_active=dict.fromkeys(
                         range(1, ROUNDS + 1), 1.0), gamma=1.0, auto_choice="exclude")


def test_a_cell_whose_median_seed_never_crosses_says_never_and_how_many_crossed(tmp_path, monkeypatch):
    """Issue 33 item 11: 4 of 5 seeds never crossing printed a median of 181 rounds (the imputed
    end of the run, ROUNDS - tau_0 + 1) for a 200-round run; the median there is 'never'."""
    from simulator.paper import table5
    deps = [_dep(1.0, crossing_after=40, seed=0), *(_never(seed=s) for s in (1, 2, 3, 4))]
    monkeypatch.setattr(table5, "collect", lambda **kw: deps)
    page = table5.write_page(tmp_path, work_dir=tmp_path, seeds=range(5), timing="t")[0].read_text()
    assert "| (1, 1) FlexFL | n/a | n/a | never (1 of 5 seeds crossed: 40) |" in page
    assert "181" not in page
    assert "No cell's median seed crossed within the 200-round run." in page
    assert table5.crossing_cell([30, 40, None]) == "40 [30, 40] (1× never)"
    assert table5.crossing_cell([30, 50, None, None]) == "never (2 of 4 seeds crossed: 30-50)"
    assert (table5.crossing_cell([]), table5.crossing_cell([None])) == ("n/a", "never")


def test_each_crossing_table_states_the_range_of_its_medians(tmp_path, monkeypatch):
    """Issue 33 item 11: results/README quoted 28-143 rounds, mixing the two crossing tables' medians."""
    from simulator.paper import table5
    deps = [_dep(1.0, crossing_after=c, seed=s, tau0=t) for s in (0, 1, 2) for t, c in ((10, 28), (50, 96))]
    monkeypatch.setattr(table5, "collect", lambda **kw: deps)
    page = table5.write_page(tmp_path, work_dir=tmp_path, seeds=range(3), timing="t")[0].read_text()
    assert page.count("Medians of the cells: 28-96 rounds after tau_0.") == 2


def test_the_page_renders_again_from_its_runs_csv(tmp_path, monkeypatch):
    """The committed table5_runs.csv holds every figure of the page: rendering from it gives the same page."""
    import json

    from simulator.paper import table5
    deps = [_dep(0.01, crossing_after=5, seed=s) for s in range(5)] + [_never(seed=s, tau0=30) for s in range(5)]
    monkeypatch.setattr(table5, "collect", lambda **kw: deps)
    path, _, _ = table5.write_page(tmp_path, work_dir=tmp_path, seeds=range(5), timing="2 min for `x`")
    (tmp_path / "table5_timing.json").write_text(json.dumps({"x": "2 min for `x`"}))
    first, csv_text = path.read_text(), (tmp_path / table5.RUNS_CSV).read_text()
    assert table5.page_from_csv(tmp_path, regime=table5.Regime()) == path
    assert path.read_text() == first and (tmp_path / table5.RUNS_CSV).read_text() == csv_text


def test_a_crossing_reads_back_from_its_runs_csv_and_a_missing_column_is_named(tmp_path):
    from flexfl.errors import ReportError
    from simulator.paper import table5
    from simulator.report import write_csv_atomic

    crossings = (
        table5.Crossing(ab=(0.5, 0.5), tau0=50, seed=3, gamma=0.25, cross=None, cross_same_test_set=12,
                        auto_choice="exclude", better_at=((2, "include"), (150, "exclude"))),
        table5.Crossing(ab=(1.0, 1.0), tau0=10, seed=0, gamma=None, cross=4, cross_same_test_set=None,
                        auto_choice="include", better_at=tuple((h, "exclude") for h in table5.HORIZONS)))
    path = tmp_path / table5.RUNS_CSV
    # the longest row first: csv.DictWriter takes the header from it (table5 writes them in that order too)
    write_csv_atomic(path, [c.to_row() for c in reversed(crossings)])
    assert table5.read_crossings(path) == tuple(reversed(crossings))
    path.write_text(path.read_text().replace("auto_choice_T200", "auto_choice"))
    with pytest.raises(ReportError, match=r"table5_runs\.csv:1: missing column 'auto_choice_T200'"):
        table5.read_crossings(path)


def test_the_leave_one_seed_out_section_gives_the_grid_of_c_in_words():
    """Issue 33 item 13: the section said "auto's c (of C_GRID)", a constant's name as prose."""
    text = loso_section(_grid())
    assert "auto's c (of 33 values log-spaced from 0.01 to 100) and the threshold rule's k" in text
    assert "C_GRID" not in text
