"""Recording profiles and inventories: the committed profile, and clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexfl.errors import ConfigError
from trace_recorder.calibrate import PAPER_TABLE2
from trace_recorder.recording.profiles import DEFAULT_PROFILE, load_inventory, load_profile


def test_committed_profile_is_the_papers_protocol() -> None:
    p = load_profile(DEFAULT_PROFILE)
    assert [t.name for t in p.traces] == list(PAPER_TABLE2)  # the paper's eight, in Table 2's order
    assert [t.cpu_load_pct for t in p.traces[:5]] == [0, 30, 50, 70, 90]
    assert [t.bandwidth for t in p.traces[5:]] == ["hi", "mi", "lo"]
    rates = [p.rate_kbit(t) for t in p.traces[5:]]
    assert rates == sorted(rates, reverse=True) and all(rates)
    assert (p.partition.dataset, p.rules.required_updates, p.rules.batch_size) == ("mnist", 20, 10)
    assert [t.name for t in p.traces if t.unloaded] == ["T0"]


def test_select_keeps_the_given_order_and_rejects_unknown_names() -> None:
    p = load_profile()
    assert [t.name for t in p.select(["T90", "T0"]).traces] == ["T90", "T0"]
    with pytest.raises(ConfigError, match="no trace T45"):
        p.select(["T45"])


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    ('name = "x"\nrounds = 5\n[[traces]]\nname = "T0"\nbandwidth = "hi"\n', "bandwidth 'hi' is not a key"),
    ('name = "x"\nrounds = 5\npct = 3\n[[traces]]\nname = "T0"\n', "pct: unknown key"),
    ('name = "x"\nrounds = 5\n[deadline]\nfactor = 0.9\n[[traces]]\nname = "T0"\n', "factor must be >= 1"),
    ('name = "x"\nrounds = 0\n[[traces]]\nname = "T0"\n', "rounds must be >= 1"),
    ('name = "x"\nrounds = 5\n[rules]\nrequired_updates = "20"\n[[traces]]\nname = "T0"\n',
     r"\[rules\].required_updates: expected an integer, got '20'"),
    ('name = "x"\nrounds = 5\n[workload]\ndataset = "mnist"\n[[traces]]\nname = "T0"\n',
     "workload: unknown key"),
    ('name = "x"\nrounds = 5\n', "no \\[\\[traces\\]\\]"),
])
def test_bad_profiles_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_profile(_write(tmp_path, text))


def test_inventory_resolves_the_token_next_to_it_and_rejects_shared_traces(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.toml"
    inv.write_text('coordinator_listen = "0.0.0.0:50051"\nfleet_token_file = "fleet_token"\n'
                   '[[devices]]\ndevice_id = "pi-01"\ntrace = "T0"\nloadgen = "tcp://10.0.0.21:5601"\n'
                   '[[devices]]\ndevice_id = "pi-02"\ntrace = "T90"\nloadgen = "tcp://10.0.0.22:5601"\n'
                   'iface = "wlan0"\n')
    loaded = load_inventory(inv)
    assert loaded.fleet_token_file == str(tmp_path / "fleet_token")
    assert [(d.device_id, d.trace, d.iface) for d in loaded.devices] == [("pi-01", "T0", ""), ("pi-02", "T90", "wlan0")]
    inv.write_text(inv.read_text().replace('trace = "T90"', 'trace = "T0"'))
    with pytest.raises(ConfigError, match="its own trace"):
        load_inventory(inv)


def test_inventory_curve_keys_resolve_next_to_it_and_come_together(tmp_path: Path) -> None:
    inv = tmp_path / "fleet.toml"
    head = 'coordinator_listen = "0.0.0.0:50051"\nfleet_token_file = "fleet_token"\n'
    devices = ('[[devices]]\ndevice_id = "pi-01"\ntrace = "T0"\nloadgen = "tcp://10.0.0.21:5601"\n'
               'loadgen_server_key = "credentials/loadgen/servers/pi-01.key"\n'
               '[[devices]]\ndevice_id = "pi-02"\ntrace = "T90"\nloadgen = "tcp://10.0.0.22:5601"\n'
               'loadgen_server_key = "/abs/pi-02.key"\n')
    inv.write_text(head + 'loadgen_client_key = "credentials/loadgen/controller.key_secret"\n' + devices)
    loaded = load_inventory(inv)
    assert loaded.loadgen_client_key == str(tmp_path / "credentials/loadgen/controller.key_secret")
    assert loaded.loadgen_server_keys() == {"tcp://10.0.0.21:5601": tmp_path / "credentials/loadgen/servers/pi-01.key",
                                            "tcp://10.0.0.22:5601": Path("/abs/pi-02.key")}
    inv.write_text(head + devices)
    with pytest.raises(ConfigError, match="loadgen_client_key is not set"):
        load_inventory(inv)
    without_server_key = devices.replace('loadgen_server_key = "/abs/pi-02.key"\n', "")
    inv.write_text(head + 'loadgen_client_key = "c.key_secret"\n' + without_server_key)
    with pytest.raises(ConfigError, match="every device needs its loadgen_server_key \\(missing for pi-02\\)"):
        load_inventory(inv)
