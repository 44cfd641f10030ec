"""The restricted unpickler: plain data reads, a pickle that would run code is refused and runs nothing."""

from __future__ import annotations

import os
import pickle
import pickletools
from pathlib import Path

import pytest

from flexfl.errors import TraceFormatError
from trace_recorder.importers.plain_pickle import load_plain_pickle


class _RunsACommand:
    """Unpickled by plain pickle, this runs `touch MARKER` (a stand-in for anything worse)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_plain_data_reads_back(tmp_path: Path) -> None:
    data = {1: {"computation": 162.0, "communication": 5648.1}, "x": [1, 2.5, ("a", True)], 2: -3}
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps(data, protocol=4))
    assert load_plain_pickle(path) == data


def test_a_pickle_that_would_run_a_command_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps({7: {"computation": 1.0, "communication": _RunsACommand(marker)}})
    assert "system" in "".join(str(arg) for _, arg, _ in pickletools.genops(payload))  # it names os.system
    pickle.loads(payload)  # the payload is live: plain pickle runs it
    assert marker.exists()
    marker.unlink()

    path = tmp_path / "evil.pkl"
    path.write_bytes(payload)
    with pytest.raises(TraceFormatError) as info:
        load_plain_pickle(path)
    message = str(info.value)
    assert message.startswith(f"{path}: refused: the pickle names ") and "system" in message
    assert "nothing was loaded or run" in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize("value, kind", [({1, 2}, "set"), (b"raw", "bytes"), (None, "NoneType"),
                                         ({"a": [1, frozenset()]}, "frozenset")])
def test_built_in_types_other_than_plain_data_are_refused(tmp_path: Path, value: object, kind: str) -> None:
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps(value, protocol=4))  # no globals needed for these
    with pytest.raises(TraceFormatError, match=f"refused: .* holds a {kind};"):
        load_plain_pickle(path)


def test_an_object_of_a_class_is_refused_at_its_class(tmp_path: Path) -> None:
    path = tmp_path / "obj.pkl"
    path.write_bytes(pickle.dumps({"p": Path("/etc")}))
    with pytest.raises(TraceFormatError, match=r"refused: the pickle names pathlib\.PosixPath"):
        load_plain_pickle(path)


@pytest.mark.parametrize("data", [b"", b"\x80\x04\x95", b"not a pickle at all", pickle.dumps([1, 2])[:-3],
                                  b"(dp0\nF\x01\n"])  # the last: the parser's own message quotes a newline
def test_broken_files_are_one_line_format_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "broken.pkl"
    path.write_bytes(data)
    with pytest.raises(TraceFormatError, match="not a readable pickle") as info:
        load_plain_pickle(path)
    assert "\n" not in str(info.value)


def test_a_global_name_with_a_newline_is_shown_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "odd.pkl"
    path.write_bytes(b"\x80\x04\x8c\x04os\nx\x94\x8c\x06system\x94\x93\x94.")  # STACK_GLOBAL 'os\nx'.'system'
    with pytest.raises(TraceFormatError, match=r"refused: the pickle names os\\nx\.system") as info:
        load_plain_pickle(path)
    assert "\n" not in str(info.value)


def test_deep_nesting_is_checked_without_recursion(tmp_path: Path) -> None:
    path = tmp_path / "deep.pkl"
    # Built with opcodes, not pickle.dumps (which would recurse): 100,000 EMPTY_LIST then APPENDs.
    path.write_bytes(b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b".")
    value = load_plain_pickle(path)  # a recursive check would raise RecursionError here
    for _ in range(99_999):
        (value,) = value
    assert value == []
