"""The trace-set format: round trips, every rejected malformation, atomic writes."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from flexfl.errors import ConfigError, TraceFormatError
from trace_recorder import format as fmt
from trace_recorder.format import (
    SCHEMA_VERSION,
    Trace,
    TraceManifest,
    read_trace_csv,
    read_trace_set,
    write_trace_set,
)


def _manifest(names: tuple[str, ...] = ("A", "B"), **changes) -> TraceManifest:
    base = TraceManifest(
        schema_version=SCHEMA_VERSION,
        name="unit",
        kind="recorded",
        description="two short traces for tests",
        source={"command": "pytest", "seed": 1},
        required_updates=5,
        deadline_s=30.0,
        traces=names,
        conditions={n: {"cpu_load_pct": 10 * i} for i, n in enumerate(names)},
        hosts=({"hostname": "pi-01", "model": "Raspberry Pi 4"},),
        created="2024-05-01T12:00:00Z",
    )
    return replace(base, **changes)


def _traces(names: tuple[str, ...] = ("A", "B")) -> list[Trace]:
    rng = np.random.default_rng(7)
    out = []
    for name in names:
        n = 12
        fraction = rng.random(n)
        fraction[3] = 0.0
        fraction[4] = 1.0
        out.append(Trace(
            name=name,
            round=np.arange(0, 2 * n, 2),
            fraction=fraction,
            extra={"train_s": rng.random(n) * 30, "upload_bytes": rng.integers(0, 10**9, n), "arrived": fraction > 0},
        ))
    return out


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "set"
    write_trace_set(path, _manifest(), _traces())
    return path


def _key_line(path: Path, key: str) -> int:
    lines = (path / "manifest.json").read_text().splitlines()
    return next(i for i, text in enumerate(lines, start=1) if f'"{key}"' in text)


def _rewrite_manifest(path: Path, **changes) -> None:
    d = json.loads((path / "manifest.json").read_text())
    for key, value in changes.items():
        if value is _DELETE:
            del d[key]
        else:
            d[key] = value
    (path / "manifest.json").write_text(json.dumps(d, indent=2) + "\n")


_DELETE = object()


def _expect(path: Path, *parts: str) -> str:
    with pytest.raises(TraceFormatError) as info:
        read_trace_set(path)
    message = str(info.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


# --- round trip ---------------------------------------------------------------------------

def test_round_trip_keeps_arrays_dtypes_extra_columns_and_manifest(trace_dir: Path) -> None:
    written = _traces()
    got = read_trace_set(trace_dir)
    assert got.manifest == _manifest()
    assert [t.name for t in got.traces] == ["A", "B"]
    for want, have in zip(written, got.traces):
        np.testing.assert_array_equal(have.round, want.round)
        assert have.round.dtype == np.int64
        # Exact equality: repr() of a float parses back to the same double.
        assert have.fraction.dtype == np.float64 and np.array_equal(have.fraction, want.fraction)
        assert list(have.extra) == ["train_s", "upload_bytes", "arrived"]
        assert np.array_equal(have.extra["train_s"], want.extra["train_s"])
        assert have.extra["upload_bytes"].dtype == np.int64
        assert np.array_equal(have.extra["upload_bytes"], want.extra["upload_bytes"])
        assert np.array_equal(have.extra["arrived"], want.extra["arrived"].astype(np.int64))


def test_trace_statistics_use_population_std() -> None:
    t = Trace(name="x", round=np.arange(4), fraction=np.array([0.0, 1.0, 0.0, 1.0]))
    assert len(t) == 4
    assert t.mean_pct == pytest.approx(50.0)
    assert t.std_pct == pytest.approx(50.0)  # ddof=1 would give 57.7
    assert t.zero_share == pytest.approx(0.5)


def test_trace_arrays_are_read_only_copies() -> None:
    source = np.array([0.5, 0.25])
    t = Trace(name="x", round=[0, 1], fraction=source)
    source[0] = 0.9
    assert t.fraction[0] == 0.5
    with pytest.raises(ValueError):
        t.fraction[0] = 0.1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"fraction": [0.5, 1.2]}, "fraction"),
        ({"fraction": [0.5, float("nan")]}, "fraction"),
        ({"round": [1, 1]}, "round"),
        ({"round": [0.0, 1.5]}, "round"),
        ({"round": [], "fraction": []}, "round"),  # no rounds at all
        ({"extra": {"fraction": [1, 2]}}, "fraction"),
        ({"extra": {"upload_s": [1.0, float("inf")]}}, "upload_s"),
    ],
)
def test_trace_constructor_rejects_bad_arrays(kwargs: dict, field: str) -> None:
    args = {"name": "x", "round": [0, 1], "fraction": [0.5, 0.5]} | kwargs
    with pytest.raises(TraceFormatError, match=f"field '{field}'"):
        Trace(**args)


def test_trace_set_first_and_get(trace_dir: Path) -> None:
    s = read_trace_set(trace_dir)
    assert [t.name for t in s.first(1)] == ["A"]
    assert [t.name for t in s.first(2)] == ["A", "B"]
    assert s.get("B").name == "B"
    for j in (0, 3, -1):
        with pytest.raises(ConfigError, match=r"out of range 1..2"):
            s.first(j)
    with pytest.raises(ConfigError, match="no trace 'C'"):
        s.get("C")


def test_blank_trailing_lines_are_fine(trace_dir: Path) -> None:
    csv = trace_dir / "A.csv"
    csv.write_text(csv.read_text() + "\n\n  \n")
    assert len(read_trace_set(trace_dir).get("A")) == 12


# --- manifest and folder errors -----------------------------------------------------------

def test_missing_folder(tmp_path: Path) -> None:
    _expect(tmp_path / "nope", "nope/manifest.json:1:", "field 'manifest'", "no trace-set folder")


def test_a_trace_file_given_for_its_set_names_the_folder(trace_dir: Path, tmp_path: Path) -> None:
    _expect(trace_dir / "A.csv", "A.csv:1:", "field 'manifest'", "a trace file, not a trace-set folder",
            f"validate the folder that holds it and its manifest.json: {trace_dir}")
    (tmp_path / "loose.csv").write_text("round,fraction\n0,1\n")
    _expect(tmp_path / "loose.csv", "a set is a folder with manifest.json and the trace CSVs")


def test_missing_manifest(trace_dir: Path) -> None:
    (trace_dir / "manifest.json").unlink()
    _expect(trace_dir, "manifest.json:1:", "field 'manifest'", "file missing")


def test_manifest_not_json_names_the_line(trace_dir: Path) -> None:
    lines = (trace_dir / "manifest.json").read_text().splitlines()
    lines[3] = lines[3].rstrip(",")  # drop a comma on line 4: the error surfaces on line 5
    (trace_dir / "manifest.json").write_text("\n".join(lines))
    _expect(trace_dir, "manifest.json:5:", "field 'manifest'", "not valid JSON")


def test_manifest_not_an_object(trace_dir: Path) -> None:
    (trace_dir / "manifest.json").write_text("[1, 2]\n")
    _expect(trace_dir, "manifest.json:1:", "field 'manifest'", "expected a JSON object")


def test_manifest_missing_key(trace_dir: Path) -> None:
    _rewrite_manifest(trace_dir, kind=_DELETE)
    _expect(trace_dir, "manifest.json:1:", "field 'kind'", "missing")


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("required_updates", "5", "expected an integer, got a string"),
        ("required_updates", True, "expected an integer, got a boolean"),
        ("required_updates", 0, "not >= 1"),
        ("deadline_s", "soon", "expected a number or null"),
        ("deadline_s", -3, "not a positive number"),
        ("kind", "guessed", "not one of calibrated, recorded"),
        ("source", "pytest", "expected an object"),
        ("traces", "A,B", "expected an array"),
        ("traces", ["A", "../B"], "not a plain name"),
        ("conditions", {"C": {}}, "unlisted trace 'C'"),
        ("hosts", ["pi-01"], "not an object"),
        ("created", "yesterday", "not an ISO 8601 time"),
        ("created", "2024-05-01T12:00:00", "not an ISO 8601 time"),
    ],
)
def test_manifest_mistyped_key_names_its_line(trace_dir: Path, key: str, value: object, problem: str) -> None:
    _rewrite_manifest(trace_dir, **{key: value})
    _expect(trace_dir, f"manifest.json:{_key_line(trace_dir, key)}:", f"field '{key}'", problem)


def test_manifest_wrong_schema_version_says_what_is_supported(trace_dir: Path) -> None:
    _rewrite_manifest(trace_dir, schema_version=2)
    _expect(trace_dir, f"manifest.json:{_key_line(trace_dir, 'schema_version')}:", "field 'schema_version'",
            "unsupported version 2", "supports 1")


def test_manifest_unknown_key(trace_dir: Path) -> None:
    _rewrite_manifest(trace_dir, deadline=30)
    _expect(trace_dir, f"manifest.json:{_key_line(trace_dir, 'deadline')}:", "field 'deadline'", "unknown field")


def test_manifest_duplicate_key(trace_dir: Path) -> None:
    text = (trace_dir / "manifest.json").read_text()
    text = text.replace('"kind": "recorded",', '"kind": "recorded",\n  "kind": "calibrated",')
    (trace_dir / "manifest.json").write_text(text)
    line = _key_line(trace_dir, "kind") + 1
    _expect(trace_dir, f"manifest.json:{line}:", "field 'kind'", "duplicate key")


def test_duplicate_trace_names(trace_dir: Path) -> None:
    _rewrite_manifest(trace_dir, traces=["A", "B", "A"])
    _expect(trace_dir, f"manifest.json:{_key_line(trace_dir, 'traces')}:", "field 'traces'", "duplicate trace name 'A'")


def test_listed_trace_file_missing(trace_dir: Path) -> None:
    (trace_dir / "B.csv").unlink()
    _expect(trace_dir, f"manifest.json:{_key_line(trace_dir, 'traces')}:", "field 'traces'", "'B' has no file")


def test_manifest_trace_count_differs_from_files(trace_dir: Path) -> None:
    (trace_dir / "C.csv").write_text("round,fraction\n0,1.0\n")
    _expect(trace_dir, f"manifest.json:{_key_line(trace_dir, 'traces')}:", "field 'traces'",
            "lists 2 traces but the folder holds 3", "C.csv")


# --- CSV errors ---------------------------------------------------------------------------

def _csv(trace_dir: Path, text: str) -> None:
    (trace_dir / "A.csv").write_text(text)


_GOOD = "round,fraction,upload_s\n" + "".join(f"{r},0.5,1.25\n" for r in range(20))


def _with_line(line_no: int, text: str) -> str:
    lines = _GOOD.splitlines()
    lines[line_no - 1] = text
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "where", "field", "problem"),
    [
        ("", ":1:", "header", "file is empty"),
        ("\n\n", ":1:", "header", "empty first line"),
        ("round,upload_s\n0,1.0\n", ":1:", "fraction", "no 'fraction' column"),
        ("fraction,upload_s\n1.0,1.0\n", ":1:", "round", "no 'round' column"),
        ("round,fraction,round\n0,1.0,0\n", ":1:", "round", "duplicate column"),
        ("round,fraction,\n0,1.0,0\n", ":1:", "column 3", "empty column name"),
        ("round,fraction\n", ":2:", "round", "no data rows"),
        (_with_line(17, "15,1.2,1.0"), ":17:", "fraction", "value '1.2' outside 0..1"),
        (_with_line(17, "15,-0.1,1.0"), ":17:", "fraction", "outside 0..1"),
        (_with_line(5, "3,0.5"), ":5:", "upload_s", "missing (line has 2 fields, header has 3)"),
        (_with_line(5, "3,0.5,1.0,9"), ":5:", "column 4", "unexpected value '9'"),
        (_with_line(6, "4,abc,1.0"), ":6:", "fraction", "value 'abc' is not a number"),
        (_with_line(6, "4,0.5,fast"), ":6:", "upload_s", "value 'fast' is not a number"),
        (_with_line(7, "5,nan,1.0"), ":7:", "fraction", "value 'nan' is not finite"),
        (_with_line(7, "5,0.5,inf"), ":7:", "upload_s", "value 'inf' is not finite"),
        (_with_line(8, "6.5,0.5,1.0"), ":8:", "round", "value '6.5' is not an integer"),
        (_with_line(8, "x,0.5,1.0"), ":8:", "round", "is not an integer"),
        (_with_line(8, "5,0.5,1.0"), ":8:", "round", "value '5' does not increase (previous round 5)"),
        (_with_line(8, "-1,0.5,1.0"), ":8:", "round", "negative"),
        (_with_line(9, ""), ":9:", "round", "blank line inside the data"),
    ],
)
def test_malformed_csv_names_file_line_and_field(
    trace_dir: Path, text: str, where: str, field: str, problem: str
) -> None:
    _csv(trace_dir, text)
    _expect(trace_dir, f"A.csv{where}", f"field '{field}'", problem)


@pytest.mark.parametrize(("text", "field", "shown"), [
    ('"\x00\n\x00"\n0\n', "round", "columns: '\\x00\\n\\x00'"),  # the fuzzer's find: a quoted newline
    ('round,fraction\n"1\n2",0.5\n', "round", "value '1\\n2' is not an integer"),
])
def test_a_quoted_newline_in_a_field_stays_escaped_on_the_errors_one_line(trace_dir: Path, text: str, field: str,
                                                                          shown: str) -> None:
    _csv(trace_dir, text)
    with pytest.raises(TraceFormatError) as info:
        read_trace_set(trace_dir)
    message = str(info.value)
    assert "\n" not in message and "\x00" not in message
    assert f"field '{field}'" in message and shown in message


def test_read_trace_csv_alone(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("round,fraction\n0,0.25\n3,0\n")
    t = read_trace_csv(path, name="x")
    assert t.name == "x" and t.round.tolist() == [0, 3] and t.fraction.tolist() == [0.25, 0.0]
    with pytest.raises(TraceFormatError, match=r"y.csv:1: field 'header': file missing"):
        read_trace_csv(tmp_path / "y.csv", name="y")


# --- writing ------------------------------------------------------------------------------

def _no_temp_files(path: Path) -> None:
    leftovers = [p.name for p in path.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert leftovers == []


def test_write_leaves_no_temp_files(trace_dir: Path) -> None:
    _no_temp_files(trace_dir)
    assert sorted(p.name for p in trace_dir.iterdir()) == ["A.csv", "B.csv", "manifest.json"]


def test_interrupted_write_is_not_a_valid_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "set"
    write_trace_set(path, _manifest(), _traces())
    real_replace = os.replace

    def crash_on_manifest(src: str, dst: str | Path) -> None:
        if Path(dst).name == "manifest.json":
            raise OSError("power lost")
        real_replace(src, dst)

    # Rewriting the same set and dying before the manifest lands: the old manifest must
    # not vouch for the new files.
    monkeypatch.setattr(fmt.os, "replace", crash_on_manifest)
    with pytest.raises(OSError, match="power lost"):
        write_trace_set(path, _manifest(description="second version"), _traces())
    monkeypatch.undo()
    _no_temp_files(path)
    _expect(path, "manifest.json:1:", "field 'manifest'", "file missing")
    # Finishing the interrupted write (same names) is allowed and gives a valid set.
    write_trace_set(path, _manifest(description="second version"), _traces())
    assert read_trace_set(path).manifest.description == "second version"


def test_write_refuses_to_mix_with_a_different_set(trace_dir: Path) -> None:
    with pytest.raises(ConfigError, match="different trace set"):
        write_trace_set(trace_dir, _manifest(("A", "C")), _traces(("A", "C")))
    with pytest.raises(ConfigError, match="different trace set"):
        write_trace_set(trace_dir, _manifest(("A",)), _traces(("A",)))
    assert read_trace_set(trace_dir).manifest.traces == ("A", "B")  # untouched


def test_write_refuses_stray_trace_files(tmp_path: Path) -> None:
    path = tmp_path / "set"
    path.mkdir()
    (path / "Z.csv").write_text("round,fraction\n0,1.0\n")
    with pytest.raises(ConfigError, match=r"Z.csv"):
        write_trace_set(path, _manifest(), _traces())


def test_write_overwrites_the_same_names(trace_dir: Path) -> None:
    new = _traces()
    new[0] = Trace(name="A", round=[0, 1], fraction=[0.0, 1.0])
    write_trace_set(trace_dir, _manifest(description="v2"), new)
    got = read_trace_set(trace_dir)
    assert got.manifest.description == "v2"
    assert got.get("A").fraction.tolist() == [0.0, 1.0]


def test_write_validates_before_touching_disk(tmp_path: Path) -> None:
    path = tmp_path / "set"
    with pytest.raises(ConfigError, match="lists traces"):
        write_trace_set(path, _manifest(("A", "B")), _traces(("B", "A")))
    with pytest.raises(TraceFormatError, match="field 'kind'"):
        write_trace_set(path, _manifest(kind="made-up"), _traces())
    with pytest.raises(TraceFormatError):
        write_trace_set(path, _manifest(deadline_s=float("nan")), _traces())
    assert not path.exists()
