"""Fuzzing the timeline reader and the restricted unpickler: generated timelines round-trip exactly;
broken files read or raise TraceFormatError (one line, naming file, line and field), never another exception.

Bounded and derandomized here (a few seconds); FLEXFL_FUZZ_EXAMPLES=N runs N random examples per test.
"""

from __future__ import annotations

import itertools
import pickle
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis (pip install -e '.[dev]')")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from benchmarks.fuzz_support import corrupted, fuzz_settings, raises_only  # noqa: E402
from flexfl.errors import TraceFormatError  # noqa: E402
from trace_recorder.importers.plain_pickle import load_plain_pickle  # noqa: E402
from trace_recorder.timeline import Conditions, Interval, Timeline, TimeUnit, read_timeline, write_timeline  # noqa: E402

pytestmark = pytest.mark.fuzz

NAMES = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,24}", fullmatch=True)
RATES = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
ERROR_RE = re.compile(r"^(?P<file>[^\n]+):(?P<line>\d+): field '[^\n]*': [^\n]+$")


@st.composite
def timelines(draw: st.DrawFn) -> Timeline:
    unit = draw(st.sampled_from(list(TimeUnit)))
    times = (st.integers(0, 2**40) if unit is TimeUnit.ROUND
             else st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False))
    devices = {}
    for name in draw(st.lists(NAMES, min_size=1, max_size=4, unique=True)):
        edges = sorted(draw(st.sets(times, min_size=2, max_size=9)))
        # Consecutive edges as intervals, some dropped (gaps are allowed).
        rows = [Interval(a, b, Conditions(draw(st.floats(0.0, 1.0)), draw(RATES), draw(RATES), draw(st.booleans())))
                for a, b in itertools.pairwise(edges) if draw(st.booleans())]
        if rows:
            devices[name] = tuple(rows)
    if not devices:
        devices["dev-0"] = (Interval(0, 1, Conditions(1.0, 1.0, 1.0, True)),)
    return Timeline(unit=unit, devices=devices)


@contextmanager
def _folder() -> Iterator[Path]:
    # Not pytest's tmp_path: hypothesis runs many examples inside one test call.
    with tempfile.TemporaryDirectory(prefix="flexfl-fuzz-") as d:
        yield Path(d)


@fuzz_settings(60)
@given(timelines())
def test_generated_timelines_round_trip_exactly(timeline: Timeline) -> None:
    with _folder() as d:
        write_timeline(d / "t.csv", timeline, comments=["generated"])
        assert read_timeline(d / "t.csv") == timeline


@fuzz_settings(150)
@given(timeline=timelines(), data=st.data())
def test_broken_timelines_read_or_name_file_line_and_field(timeline: Timeline, data: st.DataObject) -> None:
    with _folder() as d:
        path = d / "t.csv"
        write_timeline(path, timeline)
        path.write_bytes(data.draw(corrupted(path.read_bytes())))
        exc = raises_only(lambda: read_timeline(path), TraceFormatError)
        if exc is not None:
            m = ERROR_RE.match(str(exc))
            assert m and m["file"] == str(path), exc
            assert 1 <= int(m["line"]) <= path.read_bytes().count(b"\n") + 2, exc


@fuzz_settings(150)
@given(data=st.data())
def test_broken_pickles_load_or_raise_a_format_error(data: st.DataObject) -> None:
    valid = pickle.dumps({1: {"computation": 1.5, "communication": [1, "a", (2.0,)]}}, protocol=data.draw(
        st.integers(0, pickle.HIGHEST_PROTOCOL)))
    with _folder() as d:
        path = d / "p.pkl"
        path.write_bytes(data.draw(corrupted(valid)))
        exc = raises_only(lambda: load_plain_pickle(path), TraceFormatError)
        if exc is not None:
            assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc), exc
