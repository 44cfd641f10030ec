"""`flexfl traces fidelity --quick` end to end on an emulated fleet: record, live FL under the same loads, simulate.

Two devices (T0, T90), 8 recorded and 8 live rounds, 3 simulations: the page and the CSV must
hold a finite KS distance per device, the fleet must be gone afterwards (namespaces, links,
cgroups, every process this test started), and a rerun must skip every phase.
"""

from __future__ import annotations

import csv
import math
import os
import re

import psutil

from flexfl.app.cli import main
from loadgen import fleet as fl


def test_quick_fidelity_run_measures_every_device_and_leaves_nothing_behind(fleet_host, stress_ng, tmp_path,
                                                                            capsys) -> None:
    prefix = f"fq{os.getpid():06x}"
    page = tmp_path / "page" / "fidelity.md"
    argv = ["traces", "fidelity", "--quick", "--work", str(tmp_path / "work"), "--out", str(page), "--prefix", prefix,
            "--subnet", f"10.78.{(os.getpid() % 60) * 4 + 1}", "--port", str(50100 + os.getpid() % 800)]
    try:
        assert main(argv) == 0
    finally:
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
        assert not fl.state_dir_of(prefix).exists()
        # agents, loadgen daemons, stress-ng and the coordinator were all this process's descendants
        assert [p.name() for p in psutil.Process().children(recursive=True)] == []
    # The recorder's and the live phase's fleet tokens are kept beside the work folder, not in it.
    assert [p for p in (tmp_path / "work").rglob("*") if "token" in p.name] == []
    assert sorted(p.parent.name for p in (tmp_path / ".work.secrets").rglob("fleet_token")) == ["live", "record"]
    printed = capsys.readouterr().out
    assert "calibration: deadline" in printed and "live round    8/8" in printed  # the phases' progress lines
    assert "simulate traces-seed-3 (4/12)" in printed and "KS distance of s/E, live vs recorded: T0 " in printed

    with open(page.with_name("fidelity_devices.csv")) as f:
        devices = {r["device"]: r for r in csv.DictReader(f)}
    assert sorted(devices) == ["T0", "T90"]
    for d in devices.values():
        assert 0 <= float(d["ks"]) <= 1 and math.isfinite(float(d["ks"])), d
        assert int(d["recorded_rounds"]) == 8 and 1 <= int(d["live_rounds"]) <= 7, d  # the recorder's rule drops some
    text = page.read_text()
    for name, d in devices.items():
        row = rf"\| {name} \| CPU competitor \d+ % \| 8 / {d['live_rounds']} \| .* \| \*\*{float(d['ks']):.3f}\*\* \|"
        assert re.search(row, text), text
    assert "CPU: " in text and "wall time" in text and "flexfl traces fidelity --quick" in text
    assert page.with_name("fidelity_ecdf.png").exists() and page.with_name("fidelity_curves.png").exists()

    assert main(argv) == 0  # every phase done: skipped, the page written again
    assert capsys.readouterr().out.count("done in an earlier run") == 3
