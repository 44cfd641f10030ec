"""One run per output folder: a lock while a process writes it, and no silent overwrite of an earlier run.

A coordinator, `flexfl live` and anything else that writes a run into a folder claims it
first. The claim takes an exclusive lock (flock on FOLDER/.flexfl.lock, released by the
kernel when the process dies, so a crash never leaves a stale lock), refuses a folder that
already holds a run unless the caller resumes it or asks for a fresh start, and removes
the temporary files a crash inside an atomic write left behind (flexfl.files).

A fresh start never deletes: the earlier run's folder is renamed to
FOLDER.previous-<UTC time> beside it, and the new run gets an empty FOLDER.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from flexfl.errors import ConfigError
from flexfl.files import remove_stale_temporaries

LOCK_NAME = ".flexfl.lock"


class RunFolderBusy(ConfigError):
    """Another live process holds the folder's lock."""


class RunFolderTaken(ConfigError):
    """The folder holds an earlier run and neither resume nor a fresh start was asked for."""


@dataclass
class RunFolder:
    """A claimed folder; release() (or the process's end) gives it up."""

    path: Path
    moved_aside: Path | None  # where a fresh start put the earlier run
    _lock: IO | None

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the descriptor drops the flock
            self._lock = None


def claim_run_folder(path: Path, *, what: str, holds_run: Callable[[Path], str | None], resume: bool = False,
                     fresh: bool = False, resumable: bool = True) -> RunFolder:
    """Lock `path` (created if missing) for one run of `what` (e.g. "flexfl coordinator").

    `holds_run(path)` says what earlier run the folder holds (e.g. "a checkpoint after round
    43"), or None when there is nothing worth keeping. Such a folder is refused unless
    `resume` (continue it) or `fresh` (move it aside first). A caller that cannot continue
    a run (`resumable` False) is not told to pass --resume.
    """
    if resume and fresh:
        raise ConfigError(f"{what}: --resume continues the run in {path} and --fresh starts a new one; pick one")
    path = Path(path)
    lock = _lock(path, what=what)
    moved = None
    try:
        earlier = holds_run(path)
        if earlier is not None and not resume:
            if not fresh:
                raise RunFolderTaken(
                    f"{path} holds an earlier run ({earlier}); "
                    + ("pass --resume to continue it, or --fresh to start " if resumable else "pass --fresh to start ")
                    + f"a new one (the earlier run is moved to {path.name}.previous-<time>, nothing is deleted), "
                    "or choose another output folder")
            moved, lock = _move_aside(path, lock, what=what)
        remove_stale_temporaries(path)  # ours alone now: no other writer can be mid-write
    except BaseException:
        lock.close()
        raise
    return RunFolder(path=path, moved_aside=moved, _lock=lock)


def secrets_dir(path: Path, *, within: Path | None = None) -> Path:
    """The private folder (mode 0700, created if missing) for the secrets of the run in folder `path`,
    e.g. its fleet token: `.<name>.secrets` beside it, never inside it.

    A results folder is zipped and shared, and its report lists its files: a token there
    was a token handed out. Beside it, the folder stays where the run's configs can find
    it (a coordinator resumed from them reads the same token), and --fresh leaves it be.

    `within`: a folder that holds `path` and is shared as a whole (a campaign's, which holds
    its runs in runs/<name>): the secrets go beside that one instead, at `path`'s place in it
    (`<parent>/.<campaign>.secrets/runs/<name>`), so that no run's secret lands in it.
    """
    shared = Path(within) if within is not None else Path(path)
    top = shared.parent / f".{shared.name}.secrets"
    private = top / Path(path).relative_to(shared)  # ValueError for a `path` outside `within`: a caller's bug
    try:
        top.mkdir(mode=0o700, parents=True, exist_ok=True)
        top.chmod(0o700)  # also when it existed with looser modes, or the umask took bits away
        private.mkdir(mode=0o700, parents=True, exist_ok=True)  # inside `top`: private whatever the umask left
    except OSError as exc:
        raise ConfigError(f"cannot use the private folder {private} for the run's secrets: {exc.strerror}") from None
    return private


def entries_besides_lock(path: Path) -> str | None:
    """holds_run for a folder a run owns entirely (e.g. `flexfl live`'s): anything in it is the earlier run."""
    names = sorted(p.name for p in path.iterdir() if p.name != LOCK_NAME)
    if not names:
        return None
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _lock(path: Path, *, what: str) -> IO:
    try:
        path.mkdir(parents=True, exist_ok=True)
        f = open(path / LOCK_NAME, "a+", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot use the output folder {path}: {exc.strerror}") from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise RunFolderBusy(f"{path} is in use by another FlexFL process ({holder}); two runs cannot write one "
                            "folder: stop that one or choose another output folder") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}: {what}\n")
    f.flush()
    return f


def _move_aside(path: Path, lock: IO, *, what: str) -> tuple[Path, IO]:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.previous-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.previous-{stamp}-{n}")
    try:
        os.rename(path, aside)  # the held lock file moves with it; the new folder gets its own
    except OSError as exc:
        raise ConfigError(f"--fresh: cannot move {path} aside to {aside}: {exc.strerror}") from None
    new_lock = _lock(path, what=what)
    lock.close()
    return aside, new_lock
