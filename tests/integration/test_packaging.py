"""FlexFL as pip installs it from a wheel (not the checkout): beside proto-plus, with its trace sets,
and `make setup` putting the checkout back when such an install replaced the editable one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the installed copies see must not depend on how this test was started (PYTHONPATH=checkout).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=cwd, env=CLEAN_ENV if env is None else env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO))
    assert built.returncode == 0, built.stderr[-2000:]
    return next(dist.glob("flexfl_testbed-*.whl"))


def test_flexfl_and_proto_plus_import_side_by_side(wheel: Path, tmp_path: Path) -> None:
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "proto" not in tops and "flexfl" in tops, tops
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    py = str(env / "bin" / "python")
    deps = _run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "proto-plus", "protobuf>=7.35.1")
    if deps.returncode != 0:
        pytest.skip(f"cannot install proto-plus from the package index here: {deps.stderr.strip()[-300:]}")
    mine = _run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", str(wheel))
    assert mine.returncode == 0, mine.stderr[-2000:]
    check = _run(py, "-c", "import proto, flexfl.proto.fleet_pb2 as pb; "
                           "assert hasattr(proto, 'Message') and hasattr(proto, 'Field'), proto.__file__; "
                           "assert pb.JoinRequest(device_id='x').device_id == 'x'; print(proto.__file__, pb.__file__)",
                 cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-2000:]
    proto_file, pb_file = check.stdout.split()
    assert "/proto/__init__.py" in proto_file and "/flexfl/proto/fleet_pb2.py" in pb_file


def test_an_installed_wheel_simulates_on_its_own_paper_traces(wheel: Path, tmp_path: Path) -> None:
    """`pip install '.[cluster]'` (not editable) used to leave `flexfl sim run` looking for
    site-packages/traces/paper."""
    site = tmp_path / "site"
    # --target: the wheel's files as a non-editable install lays them out; its dependencies
    # (torch, grpc, ...) come from this interpreter's environment.
    done = _run(sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                "--no-compile", "--target", str(site), str(wheel))
    assert done.returncode == 0, done.stderr[-2000:]
    env = {**CLEAN_ENV, "PYTHONPATH": str(site)}  # the install only: not this checkout
    where = _run(sys.executable, "-c", "import trace_recorder; print(trace_recorder.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.strip() == str(site / "trace_recorder" / "__init__.py"), (where.stdout, where.stderr[-500:])
    out = tmp_path / "sim"
    sim = _run(str(site / "bin" / "flexfl"), "sim", "run", "--dataset", "synthetic", "--devices", "6",
               "--num-traces", "4", "--rounds", "2", "--out", str(out), cwd=tmp_path, env=env)
    assert sim.returncode == 0, sim.stderr[-2000:]
    trace_set = json.loads((out / "summary.json").read_text())["config"]["traces"]["set"]
    assert Path(trace_set) == site / "trace_recorder" / "traces" / "paper", trace_set
    assert "final test accuracy" in sim.stdout
    # `flexfl live` (make demo) takes its default from the same place.
    live = _run(sys.executable, "-c", "from flexfl.app.live import LiveConfig; print(LiveConfig().trace_set)",
                cwd=tmp_path, env=env)
    assert Path(live.stdout.strip()) == site / "trace_recorder" / "traces" / "paper", (live.stdout, live.stderr[-500:])


def test_make_setup_puts_the_checkout_back_over_a_copied_install(wheel: Path, tmp_path: Path) -> None:
    """After `pip install .` (not -e) .venv ran a copy that no longer followed the checkout, and make setup kept it."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    (env_dir / ".flexfl-installed").touch()  # make setup's stamp: set up once, newer than pyproject.toml
    copied = _run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", str(wheel))
    assert copied.returncode == 0, copied.stderr[-2000:]

    def flexfl_file() -> str:  # -I: not the working directory's flexfl, only what is installed
        return _run(py, "-I", "-c", "import flexfl; print(flexfl.__file__)", cwd=tmp_path).stdout.strip()

    assert flexfl_file().startswith(str(env_dir)), flexfl_file()
    repaired = _run("make", "--no-print-directory", "-C", str(REPO), "setup", f"VENV={env_dir}")
    assert repaired.returncode == 0, (repaired.stdout + repaired.stderr)[-2000:]
    assert flexfl_file() == str(REPO / "flexfl" / "__init__.py"), repaired.stdout + repaired.stderr
    assert "not this checkout" in repaired.stdout
    again = _run("make", "--no-print-directory", "-C", str(REPO), "setup", f"VENV={env_dir}")
    assert again.returncode == 0 and "not this checkout" not in again.stdout, again.stdout + again.stderr
