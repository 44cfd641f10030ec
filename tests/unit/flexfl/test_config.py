"""The config layer: every config round-trips through TOML, and every kind of bad file says what and where."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.rules.config import RulesConfig
from edge_agent.config import AgentConfig, ParticipationConfig
from flexfl.app.live import EmulationConfig, LiveConfig
from flexfl.config import dump_toml, load_config, to_dict, write_config
from flexfl.errors import ConfigError
from flexfl.run_spec import DeadlineRunSpec, RunSpec
from flexfl.vocabulary import DeparturePolicy, Scheme
from simulator.engine import ArrivalEvent, DepartureEvent, ScheduleConfig, SimConfig, TracesConfig
from trace_recorder.recording.profiles import Inventory, InventoryDevice, load_profile
from workloads.partition_spec import PartitionSpec

REPO = Path(__file__).resolve().parents[3]

# One non-default instance of every config FlexFL reads or writes.
CONFIGS = {
    "coordinator": CoordinatorConfig(
        server=ServerConfig(listen="0.0.0.0:6000", fleet_token_file="/etc/flexfl/token", max_update_mib=8.0),
        partition=PartitionSpec(dataset="synthetic", n_devices=30, alpha=0.5, beta=0.5, sizes="equal", seed=4),
        rules=RulesConfig(scheme=Scheme.B, required_updates=10, eta0=0.3, fast_reboot=False,
                          departure_policy=DeparturePolicy.INCLUDE),
        run=RunConfig(rounds=7, deadline_s=2.5, min_devices=3, seed=9), output=OutputConfig(dir="/var/lib/out")),
    "agent": AgentConfig(coordinator="10.0.0.1:50051", device_id="pi-03", shard_index=3, fleet_token_file="/t",
                         partition=PartitionSpec(dataset="mnist", n_devices=10, iid=True),
                         participation=ParticipationConfig(trace="/traces/paper:T50", forced_updates=(1, 2, 3),
                                                           join_in_round=4)),
    "sim": SimConfig(partition=PartitionSpec(dataset="mnist", n_devices=100, total_samples=6000),
                     rules=RulesConfig(scheme=Scheme.A, eta0=0.1), traces=TracesConfig(set="/traces/x", num_traces=3),
                     schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=3, round=30),),
                                             departures=(
                                                 DepartureEvent(device=0, round=50, policy=DeparturePolicy.INCLUDE),
                                                 DepartureEvent(device=1, round=60))),
                     run=RunSpec(rounds=80, seed=2)),
    "live": LiveConfig(partition=PartitionSpec(n_devices=6), run=DeadlineRunSpec(rounds=12), arrive_round=3,
                       depart_round=0, out="/tmp/live", emulate=EmulationConfig(enabled=True, up_kbit=(0, 8000))),
    "profile": replace(load_profile(), path=""),
    "inventory": Inventory(coordinator_listen="0.0.0.0:50051", fleet_token_file="/etc/flexfl/token",
                           devices=(InventoryDevice(device_id="pi-01", trace="T0", loadgen="tcp://10.0.0.21:5601"),)),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_dump_then_load_gives_the_same_config(name: str, tmp_path: Path) -> None:
    cfg = CONFIGS[name]
    path = write_config(tmp_path / f"{name}.toml", cfg, header=f"test {name}")
    loaded = load_config(type(cfg), path)
    if name == "profile":
        loaded = replace(loaded, path="")
    assert loaded == cfg
    assert to_dict(loaded) == to_dict(cfg)
    assert path.read_text().startswith(f"# test {name}\n")


# Per config: a table path and key, a value of the wrong type, and the expected message.
WRONG_TYPES = {
    "coordinator": (("run",), "rounds", "ten", r"\[run\].rounds: expected an integer, got 'ten'"),
    "agent": ((), "shard_index", 1.5, r"shard_index: expected an integer, got 1.5"),
    "sim": (("traces",), "num_traces", True, r"\[traces\].num_traces: expected an integer, got True"),
    "live": (("emulate",), "enabled", "yes", r"\[emulate\].enabled: expected true or false, got 'yes'"),
    "profile": (("deadline",), "factor", "big", r"\[deadline\].factor: expected a finite number, got 'big'"),
    "inventory": ((), "devices", "pi-01", r"devices: expected a list, got 'pi-01'"),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_unknown_key_wrong_type_and_missing_file_are_clear(name: str, tmp_path: Path) -> None:
    cfg = CONFIGS[name]
    cls = type(cfg)
    text = dump_toml(cfg)
    key = next(iter(to_dict(cfg)))  # a misspelt top-level key
    bad = tmp_path / "unknown.toml"
    bad.write_text(f"{key}x = 1\n" + text)
    with pytest.raises(ConfigError, match=rf"{bad}: {key}x: unknown key; did you mean '{key}'\?"):
        load_config(cls, bad)
    tables, field_name, value, message = WRONG_TYPES[name]
    raw = to_dict(cfg)
    node = raw
    for t in tables:
        node = node.setdefault(t, {})
    node[field_name] = value
    with pytest.raises(ConfigError, match=message):
        load_config(cls, None, overrides=raw)
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'nope.toml'}: cannot read config"):
        load_config(cls, tmp_path / "nope.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(ConfigError, match=rf"{binary}: not a text file"):
        load_config(cls, binary)


def test_enum_and_nested_errors_name_file_table_key_and_choices(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[rules]\nscheme = "D"\n')
    with pytest.raises(ConfigError, match=rf"{path}: \[rules\].scheme: expected one of A, B, C, got 'D'"):
        load_config(CoordinatorConfig, path)
    path.write_text('[run]\nrounds = "ten"\n')
    with pytest.raises(ConfigError, match=r"\[run\].rounds: expected an integer, got 'ten'"):
        load_config(CoordinatorConfig, path)
    path.write_text('[partition]\ndataset = "mnist"\nalpha = 0.5\n')
    with pytest.raises(ConfigError, match=rf"{path}: \[partition\] partition.alpha/beta shape SYNTHETIC only"):
        load_config(CoordinatorConfig, path)
    path.write_text('[[schedule.arrivals]]\ndevice = 3\n')
    with pytest.raises(ConfigError, match=r"\[schedule.arrivals\[0\]\].round: missing \(required\)"):
        load_config(SimConfig, path)


def test_relative_paths_in_a_file_resolve_against_its_folder_and_flags_against_the_cwd(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "c.toml"
    path.write_text('[server]\nfleet_token_file = "token"\n[output]\ndir = "../out"\n')
    cfg = load_config(CoordinatorConfig, path, overrides={"output": {"dir": "here"}})
    assert cfg.server.fleet_token_file == str(tmp_path / "sub" / "token")
    assert cfg.output.dir == "here"


@pytest.mark.parametrize("example, cls", [("coordinator/example.toml", CoordinatorConfig),
                                          ("edge_agent/example.toml", AgentConfig)])
def test_committed_examples_load(example: str, cls: type) -> None:
    load_config(cls, REPO / example)


def test_secrets_are_never_written(tmp_path: Path) -> None:
    cfg = replace(CONFIGS["coordinator"], server=replace(CONFIGS["coordinator"].server, fleet_token="s3cret"))
    assert "s3cret" not in dump_toml(cfg)
    text = (tmp_path / "c.toml")
    text.write_text('[server]\nfleet_token = "s3cret"\n')
    with pytest.raises(ConfigError, match="fleet_token: unknown key; did you mean 'fleet_token_file'"):
        load_config(CoordinatorConfig, text)


def test_a_partial_table_changes_only_its_keys_of_the_fields_default(tmp_path: Path) -> None:
    # SimConfig's partition defaults to 50 devices, LiveConfig's to 5 equal shards.
    path = tmp_path / "s.toml"
    path.write_text('[partition]\nseed = 3\n')
    assert load_config(SimConfig, path).partition == PartitionSpec(n_devices=50, seed=3)
    live = load_config(LiveConfig, None, overrides={"partition": {"n_devices": 4}})
    assert (live.partition.n_devices, live.partition.sizes) == (4, "equal")


def test_relative_paths_are_written_absolute_so_the_file_means_the_same(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = CoordinatorConfig(server=ServerConfig(fleet_token_file="run/fleet_token"), output=OutputConfig(dir="run/c"))
    path = write_config(tmp_path / "run" / "coordinator.toml", cfg)
    loaded = load_config(CoordinatorConfig, path)
    assert loaded.server.fleet_token_file == str(tmp_path / "run" / "fleet_token")
    assert loaded.output.dir == str(tmp_path / "run" / "c")
