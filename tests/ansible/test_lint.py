"""Fast checks of ansible/: yamllint, ansible-lint (production profile), syntax of every
playbook, and that every role variable is prefixed, documented and listed in
example.config.yml. No target host needed; about a minute, most of it ansible-lint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ANSIBLE_DIR = Path(__file__).resolve().parents[2] / "ansible"
PLAYBOOKS = ("testbed.yml", "coordinator.yml", "agents.yml", "status.yml", "fetch_results.yml",
             "recorder_inventory.yml")
ROLES = ("common", "flexfl_install", "credentials", "coordinator", "edge_agent")

TOP_KEY = re.compile(r"^([a-z_][a-z0-9_]*):")
COMMENTED_KEY = re.compile(r"^# ([a-z_][a-z0-9_]*):")


def defaults_lines(role: str) -> list[str]:
    return (ANSIBLE_DIR / "roles" / role / "defaults" / "main.yml").read_text().splitlines()


def role_variables(role: str) -> list[str]:
    return [m.group(1) for line in defaults_lines(role) if (m := TOP_KEY.match(line))]


def undocumented_variables(role: str) -> list[str]:
    """Keys with neither an inline comment nor a comment block above them (up to a blank line)."""
    missing, documented = [], False
    for line in defaults_lines(role):
        if not line.strip():
            documented = False
        elif line.startswith("#"):
            documented = True
        elif (m := TOP_KEY.match(line)) and not documented and " # " not in line:
            missing.append(m.group(1))
    return missing


def test_yamllint_is_clean(ansible_tools) -> None:
    yamllint = ansible_tools.require("yamllint")
    proc = ansible_tools.run(yamllint, ["--strict", "--format", "parsable", "."], cwd=ANSIBLE_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_lint_production_profile_is_clean(ansible_tools) -> None:
    ansible_lint = ansible_tools.require("ansible-lint")
    proc = ansible_tools.run(
        ansible_lint,
        ["--profile", "production", "--offline", "--project-dir", ".", "-c", ".ansible-lint", "--nocolor"],
        cwd=ANSIBLE_DIR, timeout_s=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(ansible_tools, playbook: str) -> None:
    ansible_playbook = ansible_tools.require("ansible-playbook")
    proc = ansible_tools.run(ansible_playbook, ["-i", "example.hosts.ini", "--syntax-check", playbook],
                             cwd=ANSIBLE_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_example_inventory_has_the_groups(ansible_tools) -> None:
    ansible_inventory = ansible_tools.require("ansible-inventory")
    proc = ansible_tools.run(ansible_inventory, ["-i", "example.hosts.ini", "--graph", "testbed"],
                             cwd=ANSIBLE_DIR)
    assert proc.returncode == 0, proc.stderr
    graph = proc.stdout
    assert "@coordinator:" in graph and "@edge_agents:" in graph, graph


@pytest.mark.parametrize("role", ROLES)
def test_role_variables_are_prefixed_and_documented(role: str) -> None:
    names = role_variables(role)
    assert names, f"roles/{role}/defaults/main.yml defines no variables"
    assert [n for n in names if not n.startswith(role + "_")] == []
    assert undocumented_variables(role) == []


def test_example_config_lists_every_role_variable() -> None:
    listed = {m.group(1) for line in (ANSIBLE_DIR / "example.config.yml").read_text().splitlines()
              if (m := COMMENTED_KEY.match(line))}
    defined = {name for role in ROLES for name in role_variables(role)}
    assert sorted(defined - listed) == [], "add these to example.config.yml"
    assert sorted(listed - defined) == [], "example.config.yml lists variables no role defines"


def test_example_config_changes_nothing() -> None:
    # Playbooks load it when config.yml is missing: it must not override the defaults.
    lines = (ANSIBLE_DIR / "example.config.yml").read_text().splitlines()
    assert [line for line in lines if line.strip() and line != "---" and not line.startswith("#")] == []


def test_recorder_inventory_is_what_the_trace_recorder_reads(ansible_tools, tmp_path: Path) -> None:
    profiles = pytest.importorskip("trace_recorder.recording.profiles", reason="FlexFL is not installed in this venv")
    ansible_playbook = ansible_tools.require("ansible-playbook")
    fleet = tmp_path / "fleet.toml"
    proc = ansible_tools.run(ansible_playbook, ["-i", "example.hosts.ini", "recorder_inventory.yml",
                                                "-e", f"recorder_inventory_path={fleet}"], cwd=ANSIBLE_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    inventory = profiles.load_inventory(fleet)
    assert [(d.device_id, d.trace, d.loadgen, d.iface) for d in inventory.devices] == [
        ("pi-01", "T0", "tcp://192.168.1.21:5601", ""),
        ("pi-02", "T30", "tcp://192.168.1.22:5601", ""),
        ("pi-03", "T50", "tcp://192.168.1.23:5601", "wlan0"),
    ]
    assert inventory.coordinator_listen == "0.0.0.0:50051" and inventory.n_devices == 3
    assert inventory.fleet_token_file == str(ANSIBLE_DIR / "credentials" / "fleet_token")
    keys = ANSIBLE_DIR / "credentials" / "loadgen"
    assert inventory.loadgen_client_key == str(keys / "controller.key_secret")
    assert inventory.loadgen_server_keys() == {f"tcp://192.168.1.2{i}:5601": keys / "servers" / f"pi-0{i}.key"
                                               for i in (1, 2, 3)}
    # The provisioned agents dial with TLS: the recording coordinator has the coordinator host's certificate,
    # and this machine watches it with the first device's (mutual TLS), as the campaign fleet file does.
    creds = ANSIBLE_DIR / "credentials"
    assert inventory.server_tls() == {"tls_cert": str(creds / "coordinator" / "fl-coordinator.pem"),
                                      "tls_key": str(creds / "coordinator" / "fl-coordinator.key"),
                                      "tls_client_ca": str(creds / "ca" / "ca.pem")}
    watch = inventory.watch_tls()
    assert watch is not None and (watch.ca, watch.client_cert) == (str(creds / "ca" / "ca.pem"),
                                                                  str(creds / "devices" / "pi-01.pem"))


def test_the_campaign_fleet_file_is_what_flexfl_live_fleet_reads(ansible_tools, tmp_path: Path) -> None:
    fleet_file = pytest.importorskip("flexfl.app.fleet_file", reason="FlexFL is not installed in this venv")
    ansible_playbook = ansible_tools.require("ansible-playbook")
    path = tmp_path / "campaign_fleet.toml"
    proc = ansible_tools.run(ansible_playbook, ["-i", "example.hosts.ini", "recorder_inventory.yml",
                                                "-e", f"recorder_inventory_path={tmp_path / 'fleet.toml'}",
                                                "-e", f"recorder_inventory_campaign_path={path}"], cwd=ANSIBLE_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fleet = fleet_file.load_fleet_file(path)
    creds = ANSIBLE_DIR / "credentials"
    assert fleet.devices == ("pi-01", "pi-02", "pi-03") and fleet.server.listen == "0.0.0.0:50051"
    assert fleet.server.fleet_token_file == str(creds / "fleet_token")
    # The coordinator host's certificate (this machine is that host) and the first device's for watching it.
    assert (fleet.server.tls_cert, fleet.server.tls_client_ca) == (str(creds / "coordinator" / "fl-coordinator.pem"),
                                                                  str(creds / "ca" / "ca.pem"))
    assert fleet.watch_address == "127.0.0.1:50051"
    assert fleet.watch.tls_client_cert == str(creds / "devices" / "pi-01.pem")


def test_real_inventory_and_credentials_stay_out_of_git() -> None:
    """Generated and site-specific files are ignored; the roles (credentials/ included) are not."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ANSIBLE_DIR.parent / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(rel: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ANSIBLE_DIR.parent).returncode == 0

    for rel in ("hosts.ini", "config.yml", "credentials/ca.key", "fetched/pi-01/metrics.jsonl", ".build/x.whl",
                "fleet.toml", "campaign_fleet.toml"):
        assert ignored(f"ansible/{rel}"), rel
    for rel in ("roles/credentials/tasks/main.yml", "example.hosts.ini", "example.config.yml"):
        assert not ignored(f"ansible/{rel}"), rel
