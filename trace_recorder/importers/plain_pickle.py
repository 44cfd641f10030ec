"""Read a pickle that may only hold plain data: dicts, lists, tuples, numbers and strings.

Unpickling runs code: a pickle names globals (functions, classes) that the unpickler imports
and calls, e.g. os.system through an object's __reduce__. Public device traces (FedScale's
client_device_capacity and client_behave_trace) are pickles of plain dicts, so this reader
refuses every global before anything is imported or called (`find_class`, through which
the unpickler resolves every global, also those of the copyreg extension registry, and
`persistent_load` both raise), then checks that what was built is plain data.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, NoReturn

from flexfl.errors import TraceFormatError
from trace_recorder.manifest import shorten

_PLAIN = (dict, list, tuple, int, float, str)  # bool is an int


class _PlainDataUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedIOBase, *, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> NoReturn:
        raise TraceFormatError(
            f"{self._path}: refused: the pickle names {_one_line(f'{module}.{name}')}, and a pickle that names "
            "anything runs it when read; a device trace holds only dicts, lists, tuples, numbers and strings "
            "(nothing was loaded or run)")

    def persistent_load(self, pid: Any) -> NoReturn:
        raise TraceFormatError(f"{self._path}: refused: the pickle asks for a persistent object (nothing was loaded)")


def load_plain_pickle(path: Path) -> Any:
    """The plain data pickled in `path`; a TraceFormatError for a global, another type or a broken file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        value = _PlainDataUnpickler(io.BytesIO(data), path=path).load()
    except TraceFormatError:
        raise
    except RecursionError:
        raise TraceFormatError(f"{path}: nested too deeply to read") from None
    except Exception as exc:
        raise TraceFormatError(f"{path}: not a readable pickle ({type(exc).__name__}: {_one_line(str(exc))})") from None
    _check_plain(value, path=path)
    return value


def _one_line(text: str) -> str:
    # Text from the file (a global's name, a parser's message quoting it) may hold newlines.
    return shorten(text.encode("unicode_escape").decode("ascii"))


def _check_plain(value: Any, *, path: Path) -> None:
    # A stack, not recursion: a deeply nested list must fail with this error, not a RecursionError.
    stack: list[tuple[Any, str]] = [(value, "top level")]
    while stack:
        item, where = stack.pop()
        if not isinstance(item, _PLAIN):
            raise TraceFormatError(f"{path}: refused: {shorten(where)} holds a {type(item).__name__}; "
                                   "a device trace holds only dicts, lists, tuples, numbers and strings")
        if isinstance(item, dict):
            for key, v in item.items():
                stack.append((key, f"a key in {where}"))
                stack.append((v, f"[{key!r}]" if where == "top level" else f"{where}[{key!r}]"))
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
