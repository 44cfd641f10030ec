"""Bad input to the real `flexfl coordinator` / `flexfl agent` commands: one line on stderr, exit code 2.

Each case runs the installed command as a user would. The commands start in parallel (each
imports torch), so the whole table costs a few seconds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadgen.harness import CoordinatorClient

TOKEN = "test-fleet-token"


def _flexfl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env={**os.environ, **(env or {})})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_error(proc: subprocess.Popen, *, timeout: float = 120) -> str:
    """Wait; assert exit code 2 and exactly one stderr line, an error without a traceback; return it."""
    _out, err = proc.communicate(timeout=timeout)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.args, proc.returncode, err[-2000:])
    assert "Traceback" not in err, err
    assert len(lines) == 1, lines
    assert lines[0].startswith("flexfl: error: "), lines
    return lines[0]


def _coordinator_toml(path: Path, *, listen: str = "127.0.0.1:0", token: str | None = "tok",
                      dataset: str = "synthetic", extra: str = "") -> Path:
    token_line = f'fleet_token_file = "{token}"\n' if token else ""
    path.write_text(f'[server]\nlisten = "{listen}"\n{token_line}[partition]\ndataset = "{dataset}"\n'
                    f'n_devices = 2\n[output]\ndir = "out-{path.stem}"\n{extra}')
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "tok").write_text(TOKEN)
    (tmp_path / "empty").write_text("")
    (tmp_path / "binary.toml").write_bytes(bytes(range(256)) * 4)
    return tmp_path


def test_coordinator_bad_inputs_give_one_line_and_exit_2(workdir: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    held = holder.getsockname()[1]
    empty_cache = workdir / "cache"
    empty_cache.mkdir()
    w = workdir
    cases = {
        "listen not HOST:PORT": (["--config", _coordinator_toml(w / "c1.toml", listen="notaport")],
                                 "server.listen: expected HOST:PORT with a port in 0..65535, got 'notaport'"),
        "port out of range": (["--config", _coordinator_toml(w / "c2.toml", listen="127.0.0.1:99999")],
                              "got port 99999"),
        "port held by another program": (["--config", _coordinator_toml(w / "c3.toml", listen=f"127.0.0.1:{held}")],
                                         f"cannot bind '127.0.0.1:{held}': port {held} is already in use"),
        "host not on this machine": (["--config", _coordinator_toml(w / "c4.toml", listen="192.0.2.1:50051")],
                                     "address 192.0.2.1 is not an address of this machine"),
        "host name that does not resolve": (["--config", _coordinator_toml(w / "c5.toml", listen="nosuch.invalid:1")],
                                            "cannot resolve host name 'nosuch.invalid'"),
        "binary TOML": (["--config", w / "binary.toml"], "binary.toml: not a text file"),
        "malformed TOML": (["--config", _coordinator_toml(w / "c6.toml", extra="[run\n")], "invalid TOML"),
        "unknown key": (["--config", _coordinator_toml(w / "c7.toml", extra="[run]\nroundz = 3\n")],
                        "[run].roundz: unknown key; did you mean 'rounds'?"),
        "wrong type": (["--config", _coordinator_toml(w / "c8.toml", extra="[run]\nrounds = 'ten'\n")],
                       "[run].rounds: expected an integer, got 'ten'"),
        "missing config file": (["--config", w / "nothere.toml"], "cannot read config"),
        # With MNIST and an empty cache, loading data first would fail on the data instead.
        "missing token file": (["--config", _coordinator_toml(w / "c9.toml", token="nothere", dataset="mnist")],
                               "nothere: No such file or directory; `flexfl token --out "),
        "empty token file": (["--config", _coordinator_toml(w / "c10.toml", token="empty")], "is empty"),
        "no token at all": (["--config", _coordinator_toml(w / "c11.toml", token=None)],
                            "`flexfl token --out FILE` makes one"),
        "TLS key missing": (["--config", _coordinator_toml(
            w / "c12.toml", extra="")], None),  # replaced below
        "resume without a checkpoint": (["--config", _coordinator_toml(w / "c13.toml"), "--resume"],
                                        "--resume: no checkpoint at"),
        "negative rounds flag": (["--config", _coordinator_toml(w / "c14.toml"), "--rounds", "0"],
                                 "run.rounds must be >= 1"),
    }
    tls = w / "c12.toml"
    tls.write_text(tls.read_text().replace("[partition]", 'tls_cert = "cert.pem"\ntls_key = "key.pem"\n[partition]'))
    cases["TLS key missing"] = (["--config", tls], "server.tls_cert: cannot read")
    try:
        procs = {name: _flexfl("coordinator", *map(str, args), cwd=w, env={"FLEXFL_CACHE": str(empty_cache)})
                 for name, (args, _) in cases.items()}
        for name, proc in procs.items():
            line = _one_line_error(proc)
            assert cases[name][1] in line, (name, line)
    finally:
        holder.close()
    assert not any(empty_cache.iterdir()), "the coordinator loaded data before checking its token"


def test_second_coordinator_on_the_same_port_fails_with_one_line(workdir: Path) -> None:
    port = _free_port()
    first = _flexfl("coordinator", "--config", str(_coordinator_toml(workdir / "a.toml", listen=f"127.0.0.1:{port}")),
                    cwd=workdir)
    try:
        client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN)
        deadline = time.monotonic() + 120
        while client.status() is None:
            assert first.poll() is None, first.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "first coordinator never answered"
            time.sleep(0.1)
        client.close()
        second = _flexfl("coordinator", "--config", str(_coordinator_toml(workdir / "b.toml",
                                                                          listen=f"127.0.0.1:{port}")), cwd=workdir)
        line = _one_line_error(second)
        assert f"port {port} is already in use by another program (another coordinator?)" in line
        assert first.poll() is None  # the first one is undisturbed
    finally:
        first.terminate()
        first.communicate(timeout=30)


def test_grpc_itself_refuses_a_second_server_on_a_port(tmp_path: Path, live_config) -> None:
    """The server option, not only the pre-check: gRPC's default SO_REUSEPORT would let both bind."""
    import asyncio
    from concurrent import futures
    from dataclasses import replace

    from coordinator.server import start_server
    from flexfl.errors import ConfigError

    cfg = live_config()

    async def two_servers() -> None:
        with futures.ThreadPoolExecutor(max_workers=1) as work:
            first, port = await start_server(cfg, engine=None, token=TOKEN, work=work)
            try:
                same = replace(cfg, server=replace(cfg.server, listen=f"127.0.0.1:{port}"))
                with pytest.raises(ConfigError,
                                   match=rf"cannot bind '127.0.0.1:{port}': port {port} is already in use"):
                    await start_server(same, engine=None, token=TOKEN, work=work)
            finally:
                await first.stop(None)

    asyncio.run(two_servers())


def test_agent_bad_inputs_give_one_line_and_exit_2(workdir: Path) -> None:
    refused = _free_port()  # nothing listens there
    w = workdir
    (w / "agent-tls.toml").write_text(f'coordinator = "127.0.0.1:{refused}"\nfleet_token_file = "tok"\n'
                                      'tls_ca = "ca.pem"\n')
    cases = {
        "coordinator not HOST:PORT": (["--coordinator", "notaport", "--token-file", "tok"],
                                      "coordinator: expected HOST:PORT with a port in 1..65535, got 'notaport'"),
        "port out of range": (["--coordinator", "127.0.0.1:99999", "--token-file", "tok"], "got port 99999"),
        "binary TOML": (["--config", "binary.toml"], "binary.toml: not a text file"),
        # Read before anything else: no retrying against an address that does not answer. An agent needs its
        # fleet's token, not a new one: the hint says to copy the coordinator's (it said only "cannot read").
        "missing token file": (["--coordinator", f"127.0.0.1:{refused}", "--token-file", "nothere"],
                               "fleet_token_file: cannot read nothere: No such file or directory; copy the "
                               "coordinator's fleet token here (`flexfl token --out nothere` makes a new one, "
                               "for a new fleet: its coordinator then needs the same file)"),
        "TLS CA missing": (["--config", "agent-tls.toml"], "tls_ca: cannot read"),
        "negative give-up": (["--coordinator", f"127.0.0.1:{refused}", "--token-file", "tok", "--give-up-after", "-1"],
                             "give_up_after_s must be >= 0"),
        "connection refused, gives up": (["--coordinator", f"127.0.0.1:{refused}", "--token-file", "tok",
                                          "--give-up-after", "1"],
                                         f"connection refused: nothing listens on port {refused} of 127.0.0.1"),
        "unknown host, gives up": (["--coordinator", "nosuch.invalid:50051", "--token-file", "tok",
                                    "--give-up-after", "1"], "cannot resolve host name 'nosuch.invalid'"),
    }
    procs = {name: _flexfl("agent", *args, cwd=w) for name, (args, _) in cases.items()}
    for name, proc in procs.items():
        _out, err = proc.communicate(timeout=120)
        # Retries are logged before the agent gives up; the error itself is the one last line.
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 2, (name, proc.returncode, err[-2000:])
        assert "Traceback" not in err, (name, err)
        assert lines[-1].startswith("flexfl: error: ") and cases[name][1] in lines[-1], (name, lines)
        assert all(" WARNING " in line for line in lines[:-1]), (name, lines)
        if "gives up" in name:
            assert "gave up after" in lines[-1] and lines[:-1], (name, lines)
        else:
            assert len(lines) == 1, (name, lines)


def test_a_bad_flag_is_blamed_on_the_command_line_not_the_config_file(workdir: Path) -> None:
    """`--coordinator localhost` was reported as `agent.toml: coordinator: ...` (or `config: ...` without a file)."""
    (workdir / "agent.toml").write_text('coordinator = "127.0.0.1:50051"\nfleet_token_file = "tok"\n')
    cases = {"with a valid file": ["--config", "agent.toml", "--coordinator", "localhost"],
             "without a file": ["--coordinator", "localhost", "--token-file", "tok"]}
    procs = {name: _flexfl("agent", *args, cwd=workdir) for name, args in cases.items()}
    for name, proc in procs.items():
        line = _one_line_error(proc)
        assert line == ("flexfl: error: command line: coordinator: expected HOST:PORT with a port in 1..65535, "
                        "got 'localhost'"), (name, line)
    # A value that is wrong in the file stays the file's, whatever the flags say.
    (workdir / "bad.toml").write_text('coordinator = "localhost"\n')
    line = _one_line_error(_flexfl("agent", "--config", "bad.toml", "--device-id", "d1", cwd=workdir))
    assert line.startswith("flexfl: error: bad.toml: coordinator: expected HOST:PORT"), line


def test_traces_validate_of_a_trace_file_says_to_give_its_folder() -> None:
    """It said `T0.csv/manifest.json:1: ... no trace-set folder at .../T0.csv`: a path that cannot exist."""
    from trace_recorder import PAPER_TRACE_SET

    line = _one_line_error(_flexfl("traces", "validate", str(PAPER_TRACE_SET / "T0.csv")))
    assert "T0.csv/manifest.json" not in line, line
    assert f"{PAPER_TRACE_SET / 'T0.csv'}:1: field 'manifest': a trace file, not a trace-set folder" in line, line
    assert f"validate the folder that holds it and its manifest.json: {PAPER_TRACE_SET}" in line, line
