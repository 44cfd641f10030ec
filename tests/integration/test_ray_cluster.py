"""A sweep driven against a real Ray head (`ray start --head`) that uses token authentication (RAY_AUTH_MODE=token,
as docs/simulation.md starts it): with the environment that page gives it runs; without, one error line and exit 2."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[cluster]' (make setup installs it)")

RAY = Path(sys.executable).parent / "ray"
if not RAY.exists():
    pytest.skip(f"no `ray` command beside {sys.executable}", allow_module_level=True)
# Ray's own knob: how many times (1 s apart) a driver tries a head that refuses it (default 20).
QUICK_GIVE_UP = {"RAY_gcs_server_port_wait_time_s": "2"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without any Ray authentication settings, HOME elsewhere (no ~/.ray/auth_token)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    return {**env, "HOME": str(home), **extra}


class Head:
    """`ray start --head --block` in its own session; `token` is the one `ray get-auth-token --generate` made."""

    def __init__(self, root: Path) -> None:
        home = root / "head-home"
        home.mkdir()
        made = subprocess.run([str(RAY), "get-auth-token", "--generate"], env=_env(home), capture_output=True,
                              text=True, timeout=120)
        assert made.returncode == 0 and made.stdout.strip(), made.stderr[-2000:]
        self.token = made.stdout.strip()
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        # docs/simulation.md's head: RAY_AUTH_MODE=token and the token in the environment, then ray start --head.
        # Ports of its own and a short temp dir (Ray's socket paths must stay under 108 bytes).
        self.proc = subprocess.Popen(
            [str(RAY), "start", "--head", "--block", "--port", str(self.port), "--num-cpus", "1",
             "--ray-client-server-port", str(_free_port()), "--include-dashboard", "false",
             "--disable-usage-stats", "--temp-dir", str(root / "t")],
            env=_env(home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token), stdout=subprocess.DEVNULL,
            stderr=(root / "head.log").open("w"), start_new_session=True)

    def stop(self) -> None:
        """SIGTERM: `ray start --block` drains and stops what it started; its session is killed if it has not."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the head's own session (start_new_session): its children only
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    root = Path(tempfile.mkdtemp(prefix="ffray"))
    h = Head(root)
    try:
        deadline = time.monotonic() + 120
        while True:  # its GCS port accepts connections
            assert h.proc.poll() is None, (root / "head.log").read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", h.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the Ray head never listened"
                time.sleep(0.2)
        yield h
    finally:
        h.stop()
        shutil.rmtree(root, ignore_errors=True)


def _sweep(address: str, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flexfl.app.cli", "sim", "schemes", "--dataset", "synthetic",
                           "--settings", "iid", "--num-traces-list", "1", "--seeds", "0", "--rounds", "3",
                           "--out", str(out), "--ray-address", address],
                          cwd=out.parent, env=env, capture_output=True, text=True, timeout=600)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and len(lines) == 1, lines
    assert lines[0].startswith("flexfl: error: cannot connect to the Ray cluster at "), lines
    return lines[0]


@pytest.mark.slow
def test_a_sweep_runs_on_a_token_cluster_with_the_readmes_environment(head: Head, tmp_path: Path) -> None:
    driver = tmp_path / "driver-home"  # another machine: no ~/.ray/auth_token
    driver.mkdir()
    done = _sweep(head.address, tmp_path / "out",
                  _env(driver, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head.token))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on the Ray cluster at" in done.stdout and "3 runs in" in done.stdout, done.stdout[-2000:]
    assert (tmp_path / "out" / "schemes_synthetic.md").is_file()


@pytest.mark.slow
def test_a_driver_without_the_token_gets_one_line_saying_what_to_set(head: Head, tmp_path: Path) -> None:
    driver = tmp_path / "driver-home"
    driver.mkdir()
    line = _one_error_line(_sweep(head.address, tmp_path / "out", _env(driver, **QUICK_GIVE_UP)))
    assert head.address in line and "RAY_AUTH_MODE=token" in line and "RAY_AUTH_TOKEN" in line, line
    log = Path(line.rsplit("Ray's messages: ", 1)[1])
    assert "Authentication token is missing or incorrect" in log.read_text()  # what Ray printed, kept aside
    log.unlink()


def test_nothing_listening_at_the_address_is_one_line_at_once(tmp_path: Path) -> None:
    """Ray alone would try 20 times for 40 s each; a TCP connection first answers in milliseconds."""
    address = f"127.0.0.1:{_free_port()}"
    driver = tmp_path / "driver-home"
    driver.mkdir()
    line = _one_error_line(_sweep(address, tmp_path / "out", _env(driver, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="x")))
    assert f"connection refused: nothing listens on port {address.split(':')[1]}" in line, line
    assert "`ray start --head`" in line, line
