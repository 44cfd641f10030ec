"""`flexfl new DIR`: the starter folder is written whole or not at all, never over a folder that holds something,
and its configs load with their plug-ins from any working folder."""

from __future__ import annotations

import sys

import pytest

from flexfl.app.cli import main
from flexfl.app.live import LiveConfig
from flexfl.app.new import STARTER, write_starter
from flexfl.config import load_config
from flexfl.errors import ConfigError
from simulator.engine import SimConfig

FILES = ["README.md", "live.toml", "myfl/__init__.py", "myfl/data.py", "myfl/model.py", "myfl/strategy.py",
         "pyproject.toml", "sim.toml"]


def test_new_writes_the_starter_into_a_new_or_empty_folder_and_refuses_one_that_holds_files(tmp_path, capsys) -> None:
    assert main(["new", str(tmp_path / "exp")]) == 0
    assert sorted(str(p.relative_to(tmp_path / "exp")) for p in (tmp_path / "exp").rglob("*") if p.is_file()) == FILES
    assert (tmp_path / "exp" / "myfl" / "model.py").read_text() == (STARTER / "myfl" / "model.py").read_text()
    out = capsys.readouterr().out
    assert f"flexfl live --config {tmp_path / 'exp' / 'live.toml'}" in out
    (tmp_path / "empty").mkdir()
    assert [str(p) for p in write_starter(tmp_path / "empty")] == FILES
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        write_starter(tmp_path / "exp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "exp"]  # no staging folder left behind


def test_the_starters_configs_name_plug_ins_that_import_from_their_own_folder(tmp_path, monkeypatch,
                                                                               forget_myfl) -> None:
    from workloads.federated import check_plugins

    write_starter(tmp_path / "exp")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sim = load_config(SimConfig, tmp_path / "exp" / "sim.toml")
    live = load_config(LiveConfig, tmp_path / "exp" / "live.toml")
    assert sim.plugin_path == live.plugin_path == str(tmp_path / "exp")
    assert (sim.partition.dataset, sim.rules.model) == ("myfl.data:blobs", "myfl.model:TinyNet")
    assert live.rules.aggregation.label == "sqrt-c" and live.out == str(tmp_path / "exp" / "out" / "live")
    check_plugins(live.partition, model=live.rules.model)  # the data splits and the model builds on its shape


def test_the_starters_entry_points_name_what_its_configs_import() -> None:
    """pyproject.toml's entry points (what a fleet's configs name once the package is installed) lead to the
    plug-ins live.toml names by import path, and its package list is the starter's package."""
    import tomllib

    project = tomllib.loads((STARTER / "pyproject.toml").read_text())
    live = tomllib.loads((STARTER / "live.toml").read_text())
    points = project["project"]["entry-points"]
    assert list(points["flexfl.datasets"].values()) == [live["partition"]["dataset"]]
    assert list(points["flexfl.models"].values()) == [live["rules"]["model"]]
    assert list(points["flexfl.strategies"].values()) == [live["rules"]["strategy"]]
    packages = [p.name for p in STARTER.iterdir() if (p / "__init__.py").is_file()]
    assert project["tool"]["setuptools"]["packages"] == packages
