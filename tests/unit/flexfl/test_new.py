"""`flexfl new DIR`: the starter folder is written whole or not at all, never over a folder that holds something,
and its configs load with their plug-ins from any working folder."""

from __future__ import annotations

import sys

import pytest

from flexfl.app.cli import main
from flexfl.app.live import LiveConfig
from flexfl.app.new import STARTER, STARTER_FLOWER, write_starter
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


FLOWER_FILES = [".flwr/config.toml", ".gitignore", "README.md", "myflower/__init__.py", "myflower/client_app.py",
                "myflower/server_app.py", "myflower/task.py", "pyproject.toml"]


def test_new_flower_writes_a_flower_app_whose_rows_go_to_an_absolute_folder_of_its_own(tmp_path, monkeypatch,
                                                                                      capsys) -> None:
    """The Flower starter is a valid Flower app (flwr's own check of pyproject.toml, its components found), its run
    config's out-dir is absolute (a ServerApp runs in its SuperLink's working folder), and its connections are in
    Flower 1.42's configuration file, not in the [tool.flwr.federations] table that flwr would move out of it."""
    import tomllib

    flower = pytest.importorskip("flwr.common.config", reason="Flower is FlexFL's [flower] extra")
    monkeypatch.chdir(tmp_path)
    assert main(["new", "--flower", "app"]) == 0
    app = tmp_path / "app"
    assert sorted(str(p.relative_to(app)) for p in app.rglob("*") if p.is_file()) == FLOWER_FILES
    assert "flwr run app --stream --federation-config num-supernodes=5" in capsys.readouterr().out
    project = tomllib.loads((app / "pyproject.toml").read_text())
    valid, errors, _ = flower.validate_config(project, check_module=True, project_dir=app)
    assert valid, errors
    assert project["tool"]["flwr"]["app"]["config"]["out-dir"] == str(app / "out" / "flower")
    assert "federations" not in project["tool"]["flwr"] and project["project"]["dependencies"] == []
    connections = tomllib.loads((app / ".flwr" / "config.toml").read_text())["superlink"]
    assert connections["local-deployment"] == {"address": "127.0.0.1:8000", "insecure": True}
    assert connections["local-simulation"] == {"address": ":local:"} and connections["default"] == "local-simulation"
    # the rest of pyproject.toml is the template's, line for line
    template = (STARTER_FLOWER / "pyproject.toml").read_text().splitlines()
    written = (app / "pyproject.toml").read_text().splitlines()
    assert [a for a, b in zip(template, written) if a != b] == ['out-dir = "out/flower"                 # rows go to '
                                                                'OUT-DIR/run-<run id>/; `flexfl new` makes it absolute']
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        write_starter(app, flower=True)
