"""Where a sweep's groups are computed: a local process pool, or Ray (a local instance or a cluster).

Every executor takes simulator.groups.GroupTask objects, runs simulator.groups.compute_group
on each (one torch thread per worker, one worker per CPU), and yields each group's results
as it finishes, in any order; the driver writes them (simulator.sweep.run_sweep). Only
configs, trace sets and per-round results travel; workers build their data themselves.

Ray is an optional extra (`pip install -e '.[cluster]'`) and is imported only here, only
when a Ray executor runs. `executor_for(jobs=, ray_address=)` picks one: a Ray address
(the flag, or Ray's own RAY_ADDRESS variable) means Ray, otherwise the process pool.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from flexfl.errors import ClusterError, ConfigError
from flexfl.net import tcp_problem
from simulator.groups import GroupTask, RunOutput, compute_group

log = logging.getLogger(__name__)


def available_cpus() -> int:
    """CPUs this process may run on (its affinity), at least 1."""
    return max(1, len(os.sched_getaffinity(0)))


class LocalExecutor:
    """`jobs` worker processes on this machine; 1 = in this process.

    Spawned: a fresh interpreter each, nothing inherited."""

    shares_files = True  # workers see the driver's work folder: groups checkpoint there as they go

    def __init__(self, *, jobs: int) -> None:
        if jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {jobs}")
        self.jobs = jobs

    def describe(self) -> str:
        return "this process" if self.jobs == 1 else f"{self.jobs} local worker processes"

    def run(self, tasks: Sequence[GroupTask]) -> Iterator[list[RunOutput]]:
        if self.jobs == 1 or len(tasks) <= 1:
            for task in tasks:
                yield compute_group(task)
            return
        pool = _pool_deaf_to_ctrl_c(min(self.jobs, len(tasks)))
        try:
            yield from pool.imap_unordered(compute_group, tasks, chunksize=1)
        finally:
            pool.terminate()  # all results are in (or the sweep stopped): end the workers
            pool.join()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pool_deaf_to_ctrl_c(processes: int):
    """A spawn pool whose workers ignore SIGINT from birth.

    Ctrl-C in a terminal signals the whole process group: workers that took it raised
    KeyboardInterrupt mid-task and printed tracebacks (3 interruptions in 4). The driver alone
    handles it and terminates the pool. An ignored signal stays ignored across exec, and Python
    then installs no KeyboardInterrupt handler, so the workers ignore it even while they import
    torch; the initializer covers a worker the pool replaces later.
    """
    main_thread = threading.current_thread() is threading.main_thread()  # signal() works there only
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        return mp.get_context("spawn").Pool(processes, initializer=_ignore_sigint)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)


class RayExecutor:
    """Ray tasks, one CPU each: on a cluster at `address`, or a fresh local instance (address "local").

    A Ray that this process already started or joined (ray.is_initialized()) is used as it
    is and left running; otherwise ray.init(address) here and ray.shutdown() when done.
    `num_cpus` sizes a fresh local instance (default: every CPU).
    """

    def __init__(self, address: str | None, *, num_cpus: int | None = None) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("a Ray address was given but Ray is not installed: pip install "
                              "-e '.[cluster]' (in FlexFL's checkout)") from None
        self.address = address
        self.num_cpus = num_cpus

    def describe(self) -> str:
        if self.address in (None, "local"):
            return "a local Ray instance"
        return f"the Ray cluster at {self.address}"

    def run(self, tasks: Sequence[GroupTask]) -> Iterator[list[RunOutput]]:
        import ray

        started_here = not ray.is_initialized()
        if started_here and self.address in (None, "local"):
            ray.init(address=self.address, num_cpus=self.num_cpus or None)
        elif started_here:
            self._connect(ray)
        log.info("Ray: %s CPUs in the cluster", ray.cluster_resources().get("CPU", 0))
        remote = ray.remote(num_cpus=1)(compute_group)
        pending = [remote.remote(task) for task in tasks]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield ray.get(ref)
        finally:
            for ref in pending:  # interrupted: do not leave the cluster busy with a sweep nobody collects
                ray.cancel(ref)
            if started_here:
                ray.shutdown()

    def _connect(self, ray) -> None:
        """ray.init(address), a failure as one ClusterError line.

        A refused or absent head makes Ray retry for ~20 s and print a warning per try from its
        C++ core (20 lines, then a traceback); they go to a file the error names instead. A host that
        does not answer at all would take Ray 20 tries of 40 s: a TCP connection is tried first."""
        gcs = (self.address or "").removeprefix("ray://")
        if ":" in gcs:  # not "auto"
            problem = tcp_problem(gcs, what="--ray-address")
            if problem:
                raise ClusterError(f"cannot connect to the Ray cluster at {self.address}: {problem}; is `ray start "
                                   "--head` running there?")
        with _stderr_to_file() as messages:
            try:
                ray.init(address=self.address)
                failure = None
            except (ConnectionError, ValueError, ray.exceptions.RayError) as exc:  # ValueError: a malformed address
                failure = exc
        if failure is None:
            sys.stderr.write(messages.read_text())  # Ray's "Connected to ..." lines, as without the detour
            messages.unlink()
            return
        said = (str(failure).strip().splitlines() or [type(failure).__name__])[0][:200]
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
            hint = ("this driver presents a token (RAY_AUTH_MODE=token): is `ray start --head` running there, and is "
                    "RAY_AUTH_TOKEN the head's `ray get-auth-token`?")
        else:
            hint = ("is `ray start --head` running there? If the cluster uses token authentication (a head started "
                    "with RAY_AUTH_MODE=token), set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to the head's "
                    "`ray get-auth-token` (docs/simulation.md, Sweeps on a cluster)")
        raise ClusterError(f"cannot connect to the Ray cluster at {self.address} (Ray: {said}); {hint}; "
                           f"Ray's messages: {messages}")


@contextmanager
def _stderr_to_file() -> Iterator[Path]:
    """File descriptor 2 (Python's and Ray's C++ logging alike) into a new temporary file, restored on exit."""
    fd, name = tempfile.mkstemp(prefix="flexfl-ray-connect-", suffix=".log")
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield Path(name)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def executor_for(*, jobs: int | None, ray_address: str | None) -> LocalExecutor | RayExecutor:
    """Ray at `ray_address` (or $RAY_ADDRESS), else `jobs` local processes (default: one per CPU)."""
    address = ray_address or os.environ.get("RAY_ADDRESS") or None
    if address:
        return RayExecutor(address, num_cpus=jobs if address == "local" else None)
    return LocalExecutor(jobs=jobs if jobs is not None else available_cpus())
