"""The report of a real short live run, opened in headless Chromium: no console error, no broken image,
no request outside the page; a screenshot is kept (tmp dir, and out/report-screenshot.png)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from flexfl.app.report import write_report
from flexfl.app.report.browser import check_page, find_chromium
from flexfl.app.report.data import read_run

REPO = Path(__file__).resolve().parents[2]

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not installed (Debian: apt-get install chromium; .ci/run installs it)")


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def live_run(tmp_path_factory) -> Path:
    """`flexfl live` with 3 devices and 8 rounds: dev-2 starts after round 1, dev-0 is stopped after round 4."""
    out = tmp_path_factory.mktemp("live") / "run"
    cmd = [sys.executable, "-m", "flexfl.app.cli", "live", "--devices", "3", "--rounds", "8", "--arrive-round", "2",
           "--depart-round", "4", "--E", "10", "--deadline-s", "1.0", "--trace-set", str(REPO / "traces" / "paper"),
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


@pytest.mark.slow
@needs_chromium
def test_live_run_report_renders_cleanly_in_chromium(live_run, tmp_path):
    report = write_report(live_run, tmp_path / "report.html")
    shot = tmp_path / "report.png"
    check = check_page(report, screenshot=shot)
    assert check.console_errors == []
    assert check.broken_images == []
    assert check.outside_requests == []
    assert check.off_right == []
    # accuracy+loss, accuracy against the wall clock, participation, why s stopped (the agents now say),
    # coefficients, traffic, durations
    assert check.images == 7
    width, height = _png_size(shot)
    assert width == 1280 and height == check.height_px > 2000
    (REPO / "out").mkdir(exist_ok=True)
    shutil.copy(shot, REPO / "out" / "report-screenshot.png")
    # The round an event is noted in depends on process start-up times: take it from the records.
    rounds = read_run(live_run).rounds
    departures = [(r.round, d) for r in rounds for d in r.departures]
    arrivals = [(r.round, d) for r in rounds for d in r.arrivals]
    assert [d for _, d in departures] == ["dev-0"]
    html = report.read_text()
    for rnd, d in departures:
        assert f"<b>{d}</b> departed during round {rnd}." in html
    for rnd, d in arrivals:
        assert f"<b>{d}</b> arrived during round {rnd}" in html


@needs_chromium
def test_the_check_catches_console_errors_broken_images_and_outside_requests(tmp_path):
    # The negative control: a page with each fault the report test must never see.
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><img src="data:image/png;base64,AAAA" alt="corrupt">'
                    '<img src="http://127.0.0.1:9/x.png" alt="outside">'
                    '<script>console.error("boom"); undefined_function();</script></body></html>')
    check = check_page(page, screenshot=tmp_path / "bad.png")
    assert sorted(check.broken_images) == ["corrupt", "outside"]
    assert "console.error: boom" in check.console_errors
    assert any("undefined_function" in e for e in check.console_errors)
    assert check.outside_requests == ["http://127.0.0.1:9/x.png"]
    assert not check.ok
    wide = tmp_path / "wide.html"  # ... and what runs past the right edge, but not a table meant to scroll
    wide.write_text('<!DOCTYPE html><html><body><p style="white-space: nowrap">' + "wide " * 400 + '</p>'
                    '<div class="scroll" style="overflow-x: auto"><table><tr><td style="white-space: nowrap">'
                    + "scrolls " * 400 + '</td></tr></table></div></body></html>')
    assert check_page(wide).off_right == ["p: wide wide wide wide wide wide wide wide"]
    assert _png_size(tmp_path / "bad.png")[0] == 1280


@pytest.mark.slow
@needs_chromium
def test_the_results_pages_section_links_wrap_at_1280_px(tmp_path):
    """Before: the links had no space between them and each kept itself on one line, so the 24 of
    results/ ran off the right edge as one line."""
    check = check_page(write_report(REPO / "results", tmp_path / "results.html"))
    assert check.off_right == [] and check.console_errors == []
