"""Plug-in names: import paths and entry points resolve, configs find them through plugin_path, and every
failure is one line naming the plug-in (and, in a config, the file, table and key)."""

from __future__ import annotations

import argparse
import textwrap
import tomllib
from pathlib import Path

import pytest
import tomli_w

from flexfl.app.cli import main
from flexfl.config import load_config
from flexfl.errors import ConfigError, PluginError
from flexfl.plugins import DATASET, MODEL, STRATEGY, PluginChoices, resolve
from simulator.engine import SimConfig


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_an_import_path_resolves_to_its_attribute_and_knows_its_folder(plugin_module) -> None:
    name = plugin_module("""
        class Outer:
            class Inner:
                pass
        def load():
            return 1
    """)
    found = resolve(DATASET, f"{name}:load")
    assert found.obj() == 1 and found.name == f"{name}:load" and found.short_name == "load"
    assert resolve(MODEL, f"{name}:Outer.Inner").obj.__qualname__ == "Outer.Inner"
    assert Path(found.folder) == Path(__import__(name).__file__).parent
    assert resolve(STRATEGY, "no-such-entry-point") is None  # a bare name nobody declares: the caller says what exists


def test_a_module_that_is_not_importable_is_one_line_saying_where_it_must_be() -> None:
    with pytest.raises(PluginError) as exc:
        resolve(MODEL, "nowhere_pkg.models:TinyNet")
    text = _one_line(exc.value)
    assert text.startswith("model plug-in 'nowhere_pkg.models:TinyNet' cannot be imported here: no module named "
                           "'nowhere_pkg'")
    assert "plugin_path" in text and "each agent" in text


def test_a_missing_attribute_names_the_module_and_suggests_a_close_name(plugin_module) -> None:
    name = plugin_module("class TinyNet: pass\n")
    with pytest.raises(PluginError, match=rf"model plug-in '{name}:TinyNett': {name} has no attribute 'TinyNett'; "
                                          r"did you mean 'TinyNet'\?"):
        resolve(MODEL, f"{name}:TinyNett")
    with pytest.raises(PluginError, match="expected MODULE:ATTRIBUTE"):
        resolve(MODEL, f"{name}:")


def test_an_exception_at_import_is_one_line_with_the_plug_ins_file_and_line(plugin_module) -> None:
    name = plugin_module("""
        x = 1
        raise ValueError("settings.yaml is missing\\nsecond line")
    """)
    with pytest.raises(PluginError) as exc:
        resolve(DATASET, f"{name}:load")
    assert _one_line(exc.value) == (f"dataset plug-in '{name}:load': importing {name} raised ValueError: "
                                    f"settings.yaml is missing second line ({name}.py:3)")


def test_a_bare_name_is_an_installed_entry_point(plugin_module, tmp_path: Path, monkeypatch) -> None:
    """A package that declares [project.entry-points."flexfl.strategies"] is found by the name it declares."""
    name = plugin_module("class Mine: pass\n")
    dist = tmp_path / "dists" / "myplugins-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugins\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[flexfl.strategies]\nmine = {name}:Mine\n")
    monkeypatch.syspath_prepend(str(dist.parent))
    found = resolve(STRATEGY, "mine")
    assert found.obj.__name__ == "Mine" and found.name == "mine"
    assert resolve(MODEL, "mine") is None  # another group's


def test_an_agent_imports_a_plug_in_only_from_its_plugin_path_or_an_entry_point(tmp_path, monkeypatch) -> None:
    """The coordinator names the dataset an agent calls: "os:getcwd" (or worse) must not run there."""
    from flexfl import plugins

    monkeypatch.setattr(plugins, "_PLUGIN_FOLDERS", [])
    monkeypatch.setattr(plugins, "_ONLY_PLUGIN_PATH", False)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    assert resolve(DATASET, "os:getcwd").obj is __import__("os").getcwd  # a simulation's own config may
    plugins.trust_only_plugin_path()
    with pytest.raises(PluginError, match=r"^dataset plug-in 'os:getcwd' is outside this agent's plugin_path \(none "
                                          r"is set\): an agent imports the plug-ins its coordinator names only from "
                                          r"there, or from an installed package's flexfl.datasets entry points"):
        resolve(DATASET, "os:getcwd")
    _write(tmp_path / "mine" / "agent_pkg_a" / "__init__.py", "def load():\n    return 1\n")
    plugins.add_import_folder(str(tmp_path / "mine"), where="agent.toml")
    assert resolve(DATASET, "agent_pkg_a:load").obj() == 1
    with pytest.raises(PluginError, match=r"outside this agent's plugin_path \(.*/mine\)"):
        resolve(DATASET, "json:loads")
    __import__("sys").modules.pop("agent_pkg_a")


def test_flag_choices_list_the_built_in_names_and_take_a_plug_in_too() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", choices=PluginChoices(["fednova", "mifa"], STRATEGY))
    assert p.parse_args(["--strategy", "mypkg.strategies:Mine"]).strategy == "mypkg.strategies:Mine"
    assert p.parse_args(["--strategy", "mifa"]).strategy == "mifa"
    with pytest.raises(SystemExit):
        p.parse_args(["--strategy", "fedavg"])  # neither built-in, an import path, nor an entry point
    assert "{fednova,mifa}" in p.format_usage()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _toml(path: Path, document: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(document))  # a relative plugin_path, as a user writes it (write_config: absolute)
    return path


def _sim_toml(folder: Path, package: str, *, rules: dict | None = None) -> Path:
    """A package `package` with a dataset and a model in `folder/code`, and sim.toml naming them (plugin_path)."""
    _write(folder / "code" / package / "__init__.py", "")
    _write(folder / "code" / package / "data.py", """
        import numpy as np
        def load():
            rng = np.random.default_rng(0)
            x = rng.normal(size=(200, 6)).astype(np.float32)
            y = (x[:, 0] > 0).astype(np.int64)
            return {"x_train": x[:160], "y_train": y[:160], "x_test": x[160:], "y_test": y[160:], "num_classes": 2}
    """)
    _write(folder / "code" / package / "model.py", """
        from torch import nn
        class Net(nn.Module):
            def __init__(self, in_features, num_classes):
                super().__init__()
                self.fc = nn.Linear(in_features, num_classes)
            def forward(self, x):
                return self.fc(x)
    """)
    rules = rules or {"model": f"{package}.model:Net", "eta0": 0.5, "batch_size": 8, "required_updates": 3}
    return _toml(folder / "sim.toml", {
        "plugin_path": "code", "run": {"rounds": 2}, "rules": rules,
        "partition": {"dataset": f"{package}.data:load", "n_devices": 4, "iid": True, "sizes": "equal"}})


def test_plugin_path_is_relative_to_the_config_and_put_on_sys_path_before_validation(tmp_path, monkeypatch) -> None:
    path = _sim_toml(tmp_path / "exp", "pp_pkg_a")
    monkeypatch.chdir(tmp_path)  # not the config's folder
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # restored after the test
    cfg = load_config(SimConfig, path)
    assert cfg.plugin_path == str(tmp_path / "exp" / "code")
    assert cfg.partition.dataset == "pp_pkg_a.data:load" and cfg.rules.model == "pp_pkg_a.model:Net"
    assert cfg.trainer_kind == "plain"  # the row trainers have kernels for the built-in models only


def test_config_errors_about_plug_ins_name_the_file_table_and_key(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    exp = tmp_path / "exp"
    path = _sim_toml(exp, "pp_pkg_b", rules={"model": "pp_pkg_b.model:Nett", "eta0": 0.5, "batch_size": 8})
    with pytest.raises(PluginError) as exc:
        load_config(SimConfig, path)
    assert _one_line(exc.value).startswith(f"{path}: [rules] rules.model: model plug-in 'pp_pkg_b.model:Nett': "
                                           "pp_pkg_b.model has no attribute 'Nett'; did you mean 'Net'?")
    _toml(path, {**tomllib.loads(path.read_text()), "plugin_path": "elsewhere"})
    with pytest.raises(ConfigError, match=rf"^{path}: plugin_path: {exp / 'elsewhere'} is not a folder"):
        load_config(SimConfig, path)
    path = _sim_toml(exp, "pp_pkg_c", rules={"model": "pp_pkg_c.model:Net"})
    with pytest.raises(ConfigError, match=rf"^{path}: rules.eta0 and rules.batch_size must be given with a plug-in "
                                          r"dataset \('pp_pkg_c.data:load'\)"):
        load_config(SimConfig, path)
    document = tomllib.loads(path.read_text())
    document["partition"]["dataset"] = "pp_pkg_c.data:lod"
    _toml(path, document)
    with pytest.raises(PluginError, match=rf"^{path}: \[partition\] partition.dataset: dataset plug-in "
                                          r"'pp_pkg_c.data:lod': pp_pkg_c.data has no attribute 'lod'"):
        load_config(SimConfig, path)


def test_the_cli_says_a_plug_in_error_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    path = _sim_toml(tmp_path / "exp", "pp_pkg_d")
    _write(tmp_path / "exp" / "code" / "pp_pkg_d" / "model.py", """
        from torch import nn
        class Net(nn.Module):
            def __init__(self, in_features, num_classes):
                super().__init__()
                self.fc = nn.Linear(in_features, 3)  # not num_classes
            def forward(self, x):
                return self.fc(x)
    """)
    out = tmp_path / "out"
    assert main(["sim", "run", "--config", str(path), "--scheme", "C", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("flexfl: error: model plug-in 'pp_pkg_d.model:Net' returned logits of shape [2, 3] for an input "
                   "[2, 6]; expected [2, 2]: one logit per class (num_classes = 2)")
    assert not out.exists()


def test_flexfl_live_checks_a_plug_in_dataset_before_it_claims_its_folder(tmp_path, monkeypatch, capsys) -> None:
    """Its coordinator would load the data in another process, after the live folder was claimed and written."""
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    exp = tmp_path / "exp"
    _sim_toml(exp, "pp_pkg_e")
    _write(exp / "code" / "pp_pkg_e" / "data.py", """
        import numpy as np
        def load():
            x = np.zeros((40, 6))  # float64
            return {"x_train": x, "y_train": np.zeros(40, np.int64), "x_test": None, "y_test": None, "num_classes": 2}
    """)
    live = _toml(exp / "live.toml", {
        "plugin_path": "code", "run": {"rounds": 3}, "out": str(tmp_path / "live"),
        "partition": {"dataset": "pp_pkg_e.data:load", "n_devices": 3},
        "rules": {"model": "pp_pkg_e.model:Net", "eta0": 0.5, "batch_size": 8}})
    assert main(["live", "--config", str(live)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("flexfl: error: dataset plug-in 'pp_pkg_e.data:load' gives x_train of dtype float64; expected "
                   "float32 (x_train.astype(np.float32))")
    assert not (tmp_path / "live").exists()
