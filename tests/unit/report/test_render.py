"""The written page: self-contained, every figure a valid SVG, every section there or left out with its reason."""

from __future__ import annotations

import base64
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from flexfl.app.cli import main
from flexfl.app.report import write_report

REPO = Path(__file__).resolve().parents[3]
SVG_URI = "data:image/svg+xml;base64,"


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "img":
            self.images.append(a)
        for key in ("href", "src"):
            if key in a and tag != "img":
                self.links.append(a[key])


def _page(path: Path) -> tuple[str, _Page]:
    html = path.read_text(encoding="utf-8")
    page = _Page()
    page.feed(html)
    return html, page


def _assert_self_contained(page: _Page) -> None:
    assert page.images, "no figures"
    for img in page.images:
        assert img["src"].startswith(SVG_URI), img["src"][:60]
        svg = ET.fromstring(base64.b64decode(img["src"][len(SVG_URI):]))  # a broken figure fails to parse
        assert svg.tag == "{http://www.w3.org/2000/svg}svg"
        assert img.get("alt")
    assert "script" not in page.tags and "link" not in page.tags
    assert all(link.startswith("#") for link in page.links), page.links


def test_live_run_report_has_every_section(live_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = write_report(live_dir)
    assert out == Path("out/report/live.html")  # its own folder, never the one it reads
    html, page = _page(out)
    _assert_self_contained(page)
    assert {"overview", "accuracy", "participation", "stop-reasons", "coefficients", "traffic", "durations",
            "devices", "config", "files"} <= page.ids
    # accuracy+loss, accuracy against the wall clock, participation, stop reasons, coefficients, traffic, durations
    assert len(page.images) == 7
    assert any(img["alt"] == "test accuracy against time" for img in page.images)
    assert "n/a:" not in html
    assert "tensor &#39;fc.weight&#39; has shape (3,) not (10, 5)" in html  # the reason, escaped
    assert "update contains NaN" in html and "arrived in round 2" in html and "departed in round 3" in html
    assert "deadline = 2 s" in html
    assert "<td>complete 2, compute 1</td>" in html  # dev-0's rounds: why s stopped, counted in the device table
    assert "<td>compute 2, missed 1, complete 1</td>" in html  # dev-2's: its update after a rejection counts


def test_a_live_run_from_before_stop_reasons_loads_and_says_why_it_has_none(live_dir, tmp_path):
    import json

    metrics = live_dir / "coordinator" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "stop_reason"}) + "\n" for r in rows))
    html, page = _page(write_report(live_dir, tmp_path / "old.html"))
    assert "stop-reasons" not in page.ids and len(page.images) == 6
    assert "<b>Why s stopped</b>: this run&#39;s metrics do not record why each device stopped" in html
    assert "participation" in page.ids and "devices" in page.ids  # the rest of the page as before


SIM_LEAVES_OUT = ("<b>Traffic</b>: a simulation sends nothing over a network",
                  "<b>Round durations</b>: a simulated round has no wall-clock duration or deadline",
                  "<b>rejected updates</b>: a simulation receives no uploads to reject")


def test_sim_run_report_leaves_out_what_a_simulation_does_not_have_and_says_why(sim_dir):
    html, page = _page(write_report(sim_dir, sim_dir / "elsewhere.html"))
    _assert_self_contained(page)
    assert len(page.images) == 3  # accuracy+loss, participation, coefficients
    assert "n/a" not in html
    assert not {"traffic", "durations"} & page.ids and "#traffic" not in page.links
    assert all(reason in html for reason in SIM_LEAVES_OUT), html
    assert "no deadline" in html and "<b>sim</b> run" in html
    assert "Tlo" in html


def test_a_sim_run_of_several_schemes_shows_each_schemes_records(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the trace set (in the checkout) is then outside the folder the report is made in
    # `flexfl sim run` writes rounds.csv (per-round aggregates of every scheme) and <scheme>/ folders.
    out = tmp_path / "sim"
    assert main(["sim", "run", "--dataset", "synthetic", "--devices", "6", "--num-traces", "3", "--rounds", "3",
                 "--out", str(out)]) == 0
    html, page = _page(write_report(out, tmp_path / "sim.html"))
    _assert_self_contained(page)
    assert "n/a" not in html
    assert {"overview", "accuracy", "participation", "coefficients", "devices", "config", "files"} <= page.ids
    # accuracy+loss; the participation the schemes share (the same s drawn: it was drawn once per scheme,
    # a 14,290 px page at 50 devices); coefficients per scheme
    assert len(page.images) == 1 + 1 + 3
    assert "<h3>Scheme A, Scheme B, Scheme C</h3>" in html and "drawn once" in html
    assert all(f"Scheme {s}</h3>" in html for s in "ABC")
    assert html.count("<td>dev-5</td>") == 1 and "shown once" in html  # the device table they share, too
    # The configuration as a config file spells it, and no path of this machine.
    assert "<th>rules.required_updates</th><td><code>20</code>" in html and "{&#39;" not in html
    assert "<th>traces.set</th><td><code>.../paper</code>" in html and str(REPO) not in html
    assert all(reason in html for reason in SIM_LEAVES_OUT), html
    assert "<code>A/metrics.jsonl</code>" in html and "E (required local updates per round) = 20" in html


@pytest.mark.parametrize("trace_set", ["paper", "recorded-emulated"])
def test_trace_set_report(tmp_path, trace_set):
    from trace_recorder.format import read_trace_set

    names = read_trace_set(REPO / "traces" / trace_set).manifest.traces
    html, page = _page(write_report(REPO / "traces" / trace_set, tmp_path / "traces.html"))
    _assert_self_contained(page)
    assert len(page.images) == len(names)
    assert {f"trace-{n}" for n in names} <= page.ids
    assert "<td class=\"num\">75.3</td>" in html  # Table 2's T30 mean beside ours


def test_sweep_report_has_table_and_cell_plots(sweep_dir, tmp_path):
    html, page = _page(write_report(sweep_dir, tmp_path / "sweep.html"))
    _assert_self_contained(page)
    assert len(page.images) == 2  # improvements against the paper, one per-cell grid (one setting)
    assert {"synthetic", "synthetic-cells"} <= page.ids
    # |T| = 3 of SYNTHETIC NIID: ours (B over A: 20.0 and 19.6 %; C over B: 5.0 and 4.9 %), the paper's 22.2, 1.8.
    assert "19.8 ± 0.3,<br>5.0 ± 0.1" in html and "22.2,<br>1.8" in html
    assert html.count("not run") == 7  # the other |T| columns
    assert "<code>schemes_synthetic.md</code>" in html and "<code>runs/schemes_synthetic</code>" in html


def test_sweep_without_per_run_files_says_so(sweep_dir, tmp_path):
    import shutil

    shutil.rmtree(sweep_dir / "runs")
    html, page = _page(write_report(sweep_dir, tmp_path / "sweep.html"))
    assert len(page.images) == 1 and "n/a: no per-run CSVs for NIID" in html


def test_cli_prints_the_path_and_rejects_other_folders(live_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(live_dir)]) == 0
    assert capsys.readouterr().out.strip() == "out/report/live.html" and Path("out/report/live.html").is_file()
    (tmp_path / "nothing").mkdir()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("flexfl: error: ") and "not a run" in err and "\n" not in err


def test_parser_does_not_import_the_report_libraries_or_torch():
    # `flexfl --help` and argument errors answer without them (benchmarks.cli_speed times it).
    heavy = ("matplotlib", "jinja2", "torch", "numba", "grpc", "zmq")
    code = ("import sys; from flexfl.app.cli import build_parser; build_parser(); "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def _svg_text(img: dict) -> str:
    return base64.b64decode(img["src"][len(SVG_URI):]).decode()


def test_a_runs_page_names_its_strategy_with_its_parameters(live_dir, tmp_path):
    from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
    from coordinator.rules.config import RulesConfig
    from flexfl.config import write_config

    html, _ = _page(write_report(live_dir, tmp_path / "scheme-c.html"))
    assert 'Aggregation strategy: <b class="strategy">Scheme C</b>' in html
    write_config(live_dir / "coordinator.toml", CoordinatorConfig(
        server=ServerConfig(listen="127.0.0.1:1"), rules=RulesConfig(required_updates=10, strategy="fedprox", mu=0.01),
        run=RunConfig(rounds=4, deadline_s=2.0), output=OutputConfig(dir=str(live_dir / "coordinator"))))
    html, page = _page(write_report(live_dir, tmp_path / "fedprox.html"))
    assert 'Aggregation strategy: <b class="strategy">FedProx (mu = 0.01)</b>' in html
    assert "FedProx (mu = 0.01)" in _svg_text(page.images[0])  # the accuracy plot's legend


def test_a_sim_run_of_several_strategies_titles_each_with_its_parameters(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["sim", "run", "--dataset", "synthetic", "--devices", "4", "--num-traces", "3", "--rounds", "2",
                 "--scheme", "C", "--scheme", "fednova", "--scheme", "fedprox", "--mu", "0.1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Scheme C, FedNova, FedProx (mu = 0.1)" in printed.splitlines()[0]
    assert "  FedNova round 2/2:" in printed and "final test accuracy: Scheme C " in printed
    html, page = _page(write_report(out, tmp_path / "sim.html"))
    assert all(f"<h3>{t}</h3>" in html for t in ("Scheme C", "FedNova", "FedProx (mu = 0.1)")), html
    assert '<td class="strategy">FedProx (mu = 0.1)</td>' in html and "Scheme fednova" not in html
    legend = _svg_text(page.images[0])
    assert all(t in legend for t in ("Scheme C", "FedNova", "FedProx (mu = 0.1)"))


def test_a_timeline_runs_conditions_are_drawn_under_its_stop_reasons_and_an_older_run_says_why_not(
        timeline_dir, tmp_path):
    html, page = _page(write_report(timeline_dir, tmp_path / "timeline.html"))
    _assert_self_contained(page)
    assert "conditions" in page.ids and len(page.images) == 7  # one figure: reasons, then the conditions below
    (figure,) = [img for img in page.images if img["alt"].startswith("stop reason and conditions")]
    svg = base64.b64decode(figure["src"][len(SVG_URI):]).decode()
    assert all(title in svg for title in ("Why each device", "applied CPU share", "applied upload", "applied download"))
    assert "&gt;off&lt;" in svg or ">off<" in svg  # dev-2's offline round is marked in the cells
    assert "<b>Device conditions</b>" not in html  # not among the sections left out
    (timeline_dir / "conditions.jsonl").unlink()  # the same run without the record: a run before timelines
    html, page = _page(write_report(timeline_dir, tmp_path / "plain.html"))
    assert "conditions" not in page.ids and len(page.images) == 7
    assert ("<b>Device conditions</b>: this run followed no device timeline (no conditions.jsonl: `flexfl live "
            "--emulate --timeline FILE` records the conditions it applies there)") in html


def test_a_runs_file_list_never_shows_its_fleet_token(live_dir, tmp_path):
    (live_dir / "fleet_token").write_text("s3cret\n")  # a run from before the token moved out of results folders
    html, _ = _page(write_report(live_dir, tmp_path / "r.html"))
    assert "<code>coordinator.log</code>" in html and "<code>fleet_token</code>" not in html and "s3cret" not in html


def test_a_campaign_page_shows_each_group_over_its_seeds_its_curves_and_links_to_ended_runs(tmp_path, live_dir):
    import shutil

    from flexfl.campaign_index import CampaignIndex, RunResult, RunState, write_index

    folder = tmp_path / "campaign"
    runs = []
    for i, (strategy, seed) in enumerate([("scheme-c", 0), ("scheme-c", 1), ("fednova", 0)]):
        name = f"strategy-{strategy}__seed-{seed}"
        ended = i < 2
        if ended:
            shutil.copytree(live_dir, folder / "runs" / name)
            (folder / "runs" / name / "report.html").write_text("<html></html>")
        runs.append(RunResult(index=i, name=name, values={"rules.strategy": strategy, "run.seed": seed},
                              state=RunState.DONE if ended else RunState.PENDING, rounds=4 if ended else None,
                              final_acc=0.5 + 0.1 * i if ended else None, last20_acc=0.5 if ended else None,
                              final_loss=1.0 if ended else None))
    write_index(folder, CampaignIndex(name="two", file="c.toml", target="loopback",
                                      axes={"rules.strategy": ["scheme-c", "fednova"], "run.seed": [0, 1]},
                                      runs=tuple(runs)))
    html = write_report(folder, tmp_path / "page.html").read_text()
    assert "2 of 3 runs ended, on loopback" in html
    assert "strategy scheme-c" in html and "55.0 [50.0, 60.0] (n=2)" in html  # the median over its two seeds
    assert "strategy fednova" in html and "not run" in html
    assert html.count('href="runs/strategy-scheme-c__seed-') == 2 and 'href="runs/strategy-fednova' not in html
    assert html.count("data:image/svg+xml;base64,") == 1  # the curves of the two ended runs
