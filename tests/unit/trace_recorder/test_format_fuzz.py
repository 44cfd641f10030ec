"""Fuzzing the trace-set reader: malformed manifests and CSVs raise TraceFormatError naming
file, line and field, never another exception; valid generated sets round-trip exactly.

Bounded and derandomized here (a few seconds); FLEXFL_FUZZ_EXAMPLES=N runs N random
examples per test instead (benchmarks/fuzz_support.py).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis (pip install -e '.[dev]')")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from benchmarks.fuzz_support import (  # noqa: E402
    corrupted,
    deeply_nested_json,
    edge_json_values,
    fuzz_settings,
    json_values,
    number_texts,
    raises_only,
)
from flexfl.errors import TraceFormatError  # noqa: E402
from trace_recorder.format import (  # noqa: E402
    KINDS,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Trace,
    TraceManifest,
    _trace_csv_text,
    read_trace_csv,
    read_trace_set,
    write_trace_set,
)

pytestmark = pytest.mark.fuzz

NAMES = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,24}", fullmatch=True)
INT64 = st.integers(-(2**63), 2**63 - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
JSON_OBJECTS = st.dictionaries(st.text(max_size=8), json_values(finite=True), max_size=4)


# ---- valid trace sets ------------------------------------------------------------------------


@st.composite
def traces(draw: st.DrawFn, name: str) -> Trace:
    n = draw(st.integers(1, 12))
    rounds = sorted(draw(st.sets(st.integers(0, 2**63 - 1), min_size=n, max_size=n)))
    fraction = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    columns = draw(st.lists(NAMES.filter(lambda c: c not in ("round", "fraction")), unique=True, max_size=3))
    extra = {}
    for col in columns:
        if draw(st.booleans()):
            extra[col] = np.array(draw(st.lists(INT64, min_size=n, max_size=n)), dtype=np.int64)
        else:
            extra[col] = np.array(draw(st.lists(FINITE, min_size=n, max_size=n)), dtype=np.float64)
    return Trace(name=name, round=np.array(rounds, dtype=np.int64), fraction=np.array(fraction), extra=extra)


def _created() -> st.SearchStrategy[str]:
    zones = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
    return st.datetimes(timezones=zones).map(lambda t: t.isoformat())


@st.composite
def trace_sets(draw: st.DrawFn) -> tuple[TraceManifest, list[Trace]]:
    names = tuple(draw(st.lists(NAMES, min_size=1, max_size=3, unique=True)))
    manifest = TraceManifest(
        schema_version=SCHEMA_VERSION,
        name=draw(st.text(min_size=1, max_size=30).filter(str.strip)),
        kind=draw(st.sampled_from(KINDS)),
        description=draw(st.text(max_size=60)),
        source=draw(JSON_OBJECTS),
        required_updates=draw(st.integers(1, 10**30)),
        deadline_s=draw(st.none() | st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)),
        traces=names,
        conditions={n: draw(JSON_OBJECTS) for n in draw(st.lists(st.sampled_from(names), unique=True))},
        hosts=tuple(draw(st.lists(JSON_OBJECTS, max_size=3))),
        created=draw(_created()),
    )
    return manifest, [draw(traces(n)) for n in names]


@contextmanager
def _folder() -> Iterator[Path]:
    # Not pytest's tmp_path: hypothesis runs many examples inside one test call.
    with tempfile.TemporaryDirectory(prefix="flexfl-fuzz-") as d:
        yield Path(d)


def _assert_same_trace(a: Trace, b: Trace) -> None:
    assert a.name == b.name
    for x, y in [(a.round, b.round), (a.fraction, b.fraction), *zip(a.extra.values(), b.extra.values())]:
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert list(a.extra) == list(b.extra)


@fuzz_settings(30)
@given(trace_sets())
def test_valid_sets_round_trip(generated: tuple[TraceManifest, list[Trace]]) -> None:
    manifest, written = generated
    with _folder() as d:
        write_trace_set(d / "set", manifest, written)
        back = read_trace_set(d / "set")
    assert back.manifest == manifest
    assert len(back.traces) == len(written)
    for a, b in zip(back.traces, written):
        _assert_same_trace(a, b)


# ---- malformed input: TraceFormatError naming file, line and field, nothing else ----------------

# format_error's one shape: <file>:<line>: field '<field>': <problem>
# (a field name from the file is shown escaped: \' and \n stay inside the quotes, on one line)
ERROR_RE = re.compile(r"^(?P<file>/[^:\n]+):(?P<line>\d+): field '(?P<field>(?:[^'\\\n]|\\.)*)': \S[^\n]*\Z")


def _check_error(exc: BaseException | None, folder: Path) -> None:
    """A reading error names a file of the set, a line in it, and a field."""
    if exc is None:
        return
    m = ERROR_RE.match(str(exc))
    assert m, f"not '<file>:<line>: field ...': {exc}"
    path = Path(m["file"])
    assert path.parent == folder and (path.name == MANIFEST_NAME or path.suffix == ".csv"), exc
    if path.exists():
        lines = path.read_bytes().count(b"\n") + 1
        assert 1 <= int(m["line"]) <= lines + 1, exc


def _write_set(folder: Path, manifest_text: bytes, csvs: dict[str, bytes]) -> None:
    folder.mkdir()
    (folder / MANIFEST_NAME).write_bytes(manifest_text)
    for name, text in csvs.items():
        (folder / f"{name}.csv").write_bytes(text)


def _read(folder: Path) -> BaseException | None:
    exc = raises_only(lambda: read_trace_set(folder), TraceFormatError)
    _check_error(exc, folder)
    return exc


MANIFEST_KEYS = list(TraceManifest.__dataclass_fields__)


@st.composite
def manifest_edits(draw: st.DrawFn, d: dict) -> str:
    """A manifest dict edited as a person or a bug would, back as JSON text (NaN and all)."""
    d = dict(d)
    kind = draw(st.sampled_from(["drop", "set", "set", "set", "unknown", "duplicate_trace", "duplicate_key",
                                 "deep", "not_object", "odd_name"]))
    key = draw(st.sampled_from(MANIFEST_KEYS))
    if kind == "drop":
        del d[key]
    elif kind == "set":  # wrong types, NaN, infinities, huge numbers, nested junk
        d[key] = draw(edge_json_values())
    elif kind == "deep":
        d[key] = "@DEEP@"
        return json.dumps(d, indent=2).replace('"@DEEP@"', deeply_nested_json())
    elif kind == "unknown":
        d[draw(st.text(max_size=10).filter(lambda k: k not in MANIFEST_KEYS))] = draw(edge_json_values())
    elif kind == "duplicate_trace":
        d["traces"] = [*list(d["traces"]), d["traces"][0]]
    elif kind == "odd_name":  # too long for a file name; a trailing newline; a path
        d["traces"] = [draw(st.sampled_from(["A" * 300, d["traces"][0] + "\n", "../" + d["traces"][0], "", "."]))]
    elif kind == "not_object":
        return json.dumps(draw(edge_json_values()))
    text = json.dumps(d, indent=2)
    if kind == "duplicate_key":  # json.loads would keep the last silently
        text = text.replace("{\n", "{\n  " + json.dumps(key) + ": " + json.dumps(d.get(key)) + ",\n", 1)
    return text


@fuzz_settings(80)
@given(st.data())
def test_edited_manifest_is_read_or_refused_with_a_trace_format_error(data: st.DataObject) -> None:
    manifest, written = data.draw(trace_sets())
    text = data.draw(manifest_edits(json.loads(manifest.to_json())))
    with _folder() as d:
        _write_set(d / "set", text.encode(), {t.name: _trace_csv_text(t).encode() for t in written})
        _read(d / "set")


@fuzz_settings(50)
@given(st.data())
def test_corrupted_files_are_read_or_refused_with_a_trace_format_error(data: st.DataObject) -> None:
    manifest, written = data.draw(trace_sets())
    files = {MANIFEST_NAME: manifest.to_json().encode(),
             **{f"{t.name}.csv": _trace_csv_text(t).encode() for t in written}}
    victim = data.draw(st.sampled_from(sorted(files)))
    files[victim] = data.draw(corrupted(files[victim]))
    with _folder() as d:
        folder = d / "set"
        folder.mkdir()
        for name, content in files.items():
            (folder / name).write_bytes(content)
        _read(folder)


@st.composite
def edited_csv(draw: st.DrawFn) -> tuple[bytes, Trace]:
    trace = draw(traces("T"))
    lines = _trace_csv_text(trace).split("\n")
    rows = [line.split(",") for line in lines[1:-1]]
    row = draw(st.integers(0, len(rows) - 1))
    col = draw(st.integers(0, len(rows[row]) - 1))
    kind = draw(st.sampled_from(["cell", "cell", "drop_cell", "add_cell", "duplicate_row", "header_cell"]))
    if kind == "cell":
        rows[row][col] = draw(number_texts())
    elif kind == "drop_cell":
        del rows[row][col]
    elif kind == "add_cell":
        rows[row].insert(col, draw(number_texts()))
    elif kind == "duplicate_row":
        rows.insert(row, list(rows[row]))
    header = lines[0].split(",")
    if kind == "header_cell":
        header[col] = draw(st.sampled_from(["", "round", "fraction", " ", "a b", "é"]) | st.text(max_size=6))
    text = "\n".join([",".join(header), *(",".join(r) for r in rows)]) + "\n"
    return text.encode("utf-8", "surrogatepass"), trace


@fuzz_settings(150)
@given(edited_csv())
def test_edited_csv_is_read_or_refused_with_a_trace_format_error(generated: tuple[bytes, Trace]) -> None:
    content, _ = generated
    with _folder() as d:
        path = d / "T.csv"
        path.write_bytes(content)
        exc = raises_only(lambda: read_trace_csv(path, name="T"), TraceFormatError)
        _check_error(exc, d)


# ---- specific malformations that must always be refused, naming the line and field ------------


def _refusal(content: str) -> str:
    with _folder() as d:
        path = d / "T.csv"
        path.write_text(content)
        exc = raises_only(lambda: read_trace_csv(path, name="T"), TraceFormatError)
        assert exc is not None, f"accepted:\n{content}"
        return str(exc).removeprefix(str(path))


@fuzz_settings(40)
@given(trace=traces("T"), data=st.data())
def test_bad_fraction_is_refused_at_its_line(trace: Trace, data: st.DataObject) -> None:
    row = data.draw(st.integers(0, len(trace) - 1))
    bad = data.draw(st.one_of(st.floats(max_value=0.0, exclude_max=True), st.floats(min_value=1.0, exclude_min=True),
                              st.sampled_from([float("nan"), float("inf"), float("-inf")])))
    lines = _trace_csv_text(trace).split("\n")
    cells = lines[row + 1].split(",")
    cells[1] = repr(bad)
    lines[row + 1] = ",".join(cells)
    assert _refusal("\n".join(lines)).startswith(f":{row + 2}: field 'fraction': ")


@fuzz_settings(40)
@given(trace=traces("T"), data=st.data())
def test_repeated_or_huge_round_is_refused_at_its_line(trace: Trace, data: st.DataObject) -> None:
    lines = _trace_csv_text(trace).split("\n")
    row = data.draw(st.integers(0, len(trace) - 1))
    cells = lines[row + 1].split(",")
    if data.draw(st.booleans()):
        lines.insert(row + 2, lines[row + 1])  # the same round twice
        line = row + 3
    else:
        cells[0] = str(data.draw(st.integers(min_value=2**63) | st.sampled_from([2**63, 10**400])))
        lines[row + 1] = ",".join(cells)
        line = row + 2
    assert _refusal("\n".join(lines)).startswith(f":{line}: field 'round': ")


@fuzz_settings(40)
@given(st.binary(max_size=512))
def test_binary_garbage_is_refused(garbage: bytes) -> None:
    with _folder() as d:
        folder = d / "set"
        _write_set(folder, garbage, {"T": garbage})
        exc = _read(folder)
        assert exc is not None
        path = d / "T.csv"
        path.write_bytes(garbage)
        _check_error(raises_only(lambda: read_trace_csv(path, name="T"), TraceFormatError), d)
