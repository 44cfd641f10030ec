"""Small file helpers every package shares: atomic writes and secret files (configs: flexfl.config)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from flexfl.errors import ConfigError


@contextmanager
def atomic_file(path: Path, mode: str = "w", *, perms: int = 0o644) -> Iterator[IO]:
    """Open a temp file beside `path`; on success fsync it and rename it over `path`.

    Readers see the old file or the new one, never half of one (on a Pi's SD card a power
    cut is the usual crash). Temp names start with "." and end in ".tmp". On an exception
    the temp file is removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        binary = "b" in mode
        with os.fdopen(fd, mode) if binary else os.fdopen(fd, mode, encoding="utf-8", newline="") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, perms)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temp files atomic_file left in `folder` when its process was killed mid-write.

    Only for a folder the caller alone writes (flexfl.run_folder holds its lock): a live
    writer's temp file would go too. Returns what was removed.
    """
    removed = []
    for tmp in Path(folder).glob(".*.tmp"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def read_secret(path: Path, *, what: str, if_missing: str = "") -> str:
    """The stripped contents of a secret file (e.g. the fleet token); empty or unreadable is an error.

    `if_missing`: what to tell a user whose file does not exist (e.g. the command that makes one).
    """
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}" + (f"; {if_missing}" if if_missing else "")
                          ) from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(f"{what}: {path} is empty")
    return value
