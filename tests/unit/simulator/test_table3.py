"""Table 3's page from hand-made run summaries: the sections it has, and where a trial's plan goes."""

from __future__ import annotations

import json

from simulator.paper import table3
from simulator.paper.table3 import HEADLINE, READINGS, Table3Page, reading_results, record_plan, render


def _summaries(readings: list[str]) -> list[dict]:
    accuracy = {"A": 0.5, "B": 0.6, "C": 0.66}
    return [{"reading": r, "setting": st, "num_traces": j, "seed": seed, "scheme": sc,
             "final_acc": accuracy[sc], "last20_acc": accuracy[sc], "final_loss": 2 - accuracy[sc]}
            for r in readings for st in ("iid", "niid") for j in (2, 4) for seed in (0, 1) for sc in "ABC"]


def _page(readings: list[str], monkeypatch) -> str:
    monkeypatch.setattr(table3, "largest_share", lambda *a, **k: 0.1)  # needs the data set; not what is tested
    results = reading_results("synthetic", _summaries(readings), seeds=[0, 1])
    return render(Table3Page(seeds=(0, 1), timing={"synthetic": "1 min"}, regime="r", progress=(), headlines=(),
                             readings=tuple(results)))


def test_the_every_reading_section_is_left_out_when_only_the_headline_ran(monkeypatch) -> None:
    """Issue 33 item 11: results/epoch-paper/table3.md ended in an empty "Every reading" section."""
    page = _page([HEADLINE], monkeypatch)
    assert "## Every reading" not in page
    last = page.splitlines()[-1]
    assert page.endswith("\n") and last.startswith("| per-label (headline) | SYNTHETIC | 4/16 | 2 |")


def test_the_every_reading_section_holds_each_other_reading(monkeypatch) -> None:
    page = _page([HEADLINE, "equal"], monkeypatch)
    section = page.split("## Every reading\n\n", 1)[1]
    assert section.startswith(f"### equal, SYNTHETIC\n\n{READINGS['equal'].text}; E = 20.\n\n| data | \\|T\\|=1 |")
    assert "| SYNTHETIC IID (FlexFL) | not run | 20.0 [20.0, 20.0] \\| 10.0 [10.0, 10.0] | not run |" in section
    assert f"### {HEADLINE}," not in section


def test_a_small_trial_beside_a_committed_page_keeps_its_plan_under_local(tmp_path) -> None:
    """Issue 33 item 13: a trial with --out results left results/table3_plan.json untracked."""
    (tmp_path / "table3_runs.csv").write_text("dataset,reading\nsynthetic,per-label\n")  # a committed page's runs
    record_plan(tmp_path, "synthetic", [], command="flexfl sim table3 --seeds 0")
    assert not (tmp_path / "table3_plan.json").exists()
    assert json.loads((tmp_path / "local" / "table3_plan.json").read_text())["synthetic"]["commands"] == [
        "flexfl sim table3 --seeds 0"]
    # A committed plan (a long sweep in progress) is added to where it is.
    (tmp_path / "table3_plan.json").write_text(json.dumps({"mnist": {"commands": ["a"], "groups": []}}))
    record_plan(tmp_path, "mnist", [], command="b")
    assert json.loads((tmp_path / "table3_plan.json").read_text())["mnist"]["commands"] == ["a", "b"]
    # A fresh folder holds its own plan.
    record_plan(tmp_path / "fresh", "synthetic", [], command="c")
    assert (tmp_path / "fresh" / "table3_plan.json").is_file()


def test_the_page_renders_again_from_its_runs_csv(tmp_path, monkeypatch) -> None:
    """write_page from runs and page_from_csv from the table3_runs.csv it wrote give the same page (item 12:
    the committed pages re-render without their runs' folders); a CSV from an older writer is refused."""
    import pytest

    from flexfl.errors import ConfigError
    from simulator.paper.regime import Regime

    summaries = [{**s, "wall_s": 1.0, "name": f"{s['reading']}_{s['setting']}_T{s['num_traces']}_seed{s['seed']}_"
                  f"{s['scheme']}"} for s in _summaries([HEADLINE, "equal"])]
    monkeypatch.setattr(table3, "largest_share", lambda *a, **k: 0.1)
    monkeypatch.setattr(table3, "finished_summaries", lambda dataset, *a, **k: summaries if dataset == "synthetic"
                        else [])
    monkeypatch.setattr(table3, "with_window", lambda found, work_dir: found)
    (tmp_path / "table3_synthetic_iid.png").write_bytes(b"")

    def plots(dataset, info):
        return {f"{dataset}_iid": info["out_dir"] / "table3_synthetic_iid.png"}

    regime = Regime(unit="epoch", eta0="paper")
    path = table3.write_page(tmp_path, work_dirs={"synthetic": tmp_path}, seeds=[0, 1], timing={"synthetic": "1 min"},
                             plots=plots, regime=regime)
    (tmp_path / "table3_timing.json").write_text(json.dumps({"synthetic": "1 min"}))
    first = path.read_text()
    assert "![synthetic_iid](table3_synthetic_iid.png)" in first and "For Table 3, E in epochs" in first
    assert table3.page_from_csv(tmp_path, regime=regime).read_text() == first
    (tmp_path / "table3_runs.csv").write_text("dataset,reading,setting,num_traces,seed,scheme,final_acc,final_loss,"
                                              "wall_s\nsynthetic,per-label,iid,1,0,A,0.5,1.0,1.0\n")
    with pytest.raises(ConfigError, match="a row without last20_acc"):
        table3.page_from_csv(tmp_path, regime=regime)
