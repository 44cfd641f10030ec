"""benchmarks.package_graph: the figures issue 32's closing note compares, on small made-up checkouts."""

from __future__ import annotations

from pathlib import Path

from benchmarks.package_graph import main


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _layout(root: Path, *, loop: bool) -> Path:
    body = "\n".join(f"    x{i} = {i}" for i in range(70))
    return _write(root, {
        "coordinator/__init__.py": "",
        "coordinator/engine.py": "from workloads.data import load\n",
        "coordinator/rules/__init__.py": "",
        "coordinator/rules/round.py": f"def long():\n{body}\n",
        "workloads/__init__.py": "",
        "workloads/data.py": ("from coordinator import engine\n" if loop else "")
        + "def load(row):\n    return row['s']\n",
    })


def test_a_loop_between_two_packages_counts_both_arrows_and_is_named(tmp_path, capsys):
    assert main(["--repo", str(_layout(tmp_path, loop=True))]) == 0
    out = capsys.readouterr().out
    assert "package graph: 3 packages, 2 arrows, 2 in loops (arrows that run back up)" in out
    assert "  loop: coordinator, workloads" in out
    assert "functions over 60 / 80 / 100 lines: 1 / 0 / 0" in out
    assert "coordinator/rules/round.py:1 long" in out
    assert 'row["..."] / row.get("..."): 1;' in out


def test_arrows_that_point_one_way_are_no_loop(tmp_path, capsys):
    assert main(["--repo", str(_layout(tmp_path, loop=False))]) == 0
    out = capsys.readouterr().out
    assert "package graph: 3 packages, 1 arrows, 0 in loops" in out
    assert "loop:" not in out
