"""Timeline files: what reads, what round-trips, and the one-line error for each kind of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexfl.errors import TraceFormatError
from trace_recorder.timeline import OFFLINE, Conditions, Interval, Timeline, TimeUnit, read_timeline, write_timeline

HEADER = "device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online\n"
GOOD = HEADER + (
    "dev-0,0,30,1.0,8000,8000,1\n"
    "dev-1,0,10,0.5,800,1600,1\n"
    "dev-0,30,45.5,0.25,800,8000,1\n"
    "dev-1,20,40,0.5,800,1600,0\n"
)


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_timeline_reads_with_its_unit_devices_and_intervals(tmp_path: Path) -> None:
    t = read_timeline(_write(tmp_path, "# made by hand\n# for a test\n" + GOOD + "\n\n"))
    assert t.unit is TimeUnit.SECOND
    assert list(t.devices) == ["dev-0", "dev-1"]  # file order
    assert t.devices["dev-0"][1] == Interval(30.0, 45.5, Conditions(0.25, 800.0, 8000.0, True))
    assert t.end == 45.5


def test_conditions_at_a_time_and_offline_outside_every_interval(tmp_path: Path) -> None:
    t = read_timeline(_write(tmp_path, GOOD))
    assert t.conditions_at("dev-0", 0) == Conditions(1.0, 8000.0, 8000.0, True)
    assert t.conditions_at("dev-0", 29.999).cpu_share == 1.0
    assert t.conditions_at("dev-0", 30).cpu_share == 0.25  # start <= t < end
    assert t.conditions_at("dev-0", 45.5) == OFFLINE  # after the last interval
    assert t.conditions_at("dev-1", 15) == OFFLINE  # a gap between intervals
    assert t.conditions_at("dev-1", 25).online is False  # an offline row
    assert t.conditions_at("dev-1", 5).online is True


def test_round_timelines_take_integer_round_ids(tmp_path: Path) -> None:
    text = "device,start_round,end_round,cpu_share,up_kbit_s,down_kbit_s,online\ndev-0,1,11,1,100,100,1\n"
    t = read_timeline(_write(tmp_path, text))
    assert t.unit is TimeUnit.ROUND
    assert t.conditions_at("dev-0", 10).online and not t.conditions_at("dev-0", 11).online


def test_write_then_read_gives_the_same_timeline(tmp_path: Path) -> None:
    t = read_timeline(_write(tmp_path, GOOD))
    out = tmp_path / "sub" / "again.csv"
    write_timeline(out, t, comments=["flexfl test", "second line"])
    assert read_timeline(out) == t
    assert out.read_text().startswith("# flexfl test\n# second line\n" + HEADER)
    assert not list(out.parent.glob(".*.tmp"))  # written through a temp file, renamed


def test_a_float_with_many_digits_reads_back_identical(tmp_path: Path) -> None:
    rows = (Interval(0.1 + 0.2, 1 / 3, Conditions(2 / 3, 1e-7, 12345.678901234567, True)),)
    t = Timeline(unit=TimeUnit.SECOND, devices={"dev-0": rows})
    write_timeline(tmp_path / "t.csv", t)
    assert read_timeline(tmp_path / "t.csv") == t


@pytest.mark.parametrize("row, line, field, problem", [
    ("dev-0,0,10,nan,8000,8000,1", 2, "cpu_share", "value 'nan' is not finite"),
    ("dev-0,0,10,-0.5,8000,8000,1", 2, "cpu_share", "value '-0.5' is negative"),
    ("dev-0,0,10,1.5,8000,8000,1", 2, "cpu_share", "value '1.5' is above 1"),
    ("dev-0,0,10,1,inf,8000,1", 2, "up_kbit_s", "value 'inf' is not finite"),
    ("dev-0,0,10,1,8000,-1,1", 2, "down_kbit_s", "value '-1' is negative"),
    ("dev-0,0,10,1,8000,fast,1", 2, "down_kbit_s", "value 'fast' is not a number"),
    ("dev-0,0,10,1,8000,8000,yes", 2, "online", "value 'yes' is not 0 or 1"),
    ("dev-0,NaN,10,1,8000,8000,1", 2, "start_s", "value 'NaN' is not finite"),
    ("dev-0,-5,10,1,8000,8000,1", 2, "start_s", "value '-5' is negative"),
    ("dev-0,10,10,1,8000,8000,1", 2, "start_s", "interval [10.0, 10.0) is empty"),
    ("dev 0,0,10,1,8000,8000,1", 2, "device", "is not a plain name"),
    ("dev-0,0,10,1,8000,8000", 2, "online", "line has 6 fields, the header 7"),
    ("dev-0,0,10,1,8000,8000,1,9", 2, "column 8", "line has 8 fields, the header 7"),
])
def test_a_bad_value_names_file_line_and_field(tmp_path: Path, row: str, line: int, field: str, problem: str) -> None:
    path = _write(tmp_path, HEADER + row + "\n")
    with pytest.raises(TraceFormatError) as info:
        read_timeline(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: field '{field}': ")
    assert problem in message and "\n" not in message


def test_overlapping_intervals_name_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "dev-0,0,30,1,8,8,1\ndev-1,0,30,1,8,8,1\ndev-0,20,40,1,8,8,1\n")
    with pytest.raises(TraceFormatError, match=r"t.csv:4: field 'start_s': device 'dev-0': interval \[20.0, 40.0\) "
                                               r"overlaps \[0.0, 30.0\) on line 2$"):
        read_timeline(path)


def test_rows_out_of_time_order_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "dev-0,30,40,1,8,8,1\ndev-0,0,10,1,8,8,1\n")
    with pytest.raises(TraceFormatError, match=r"t.csv:3: field 'start_s': .* comes before \[30.0, 40.0\) on line 2"):
        read_timeline(path)


@pytest.mark.parametrize("header, field, problem", [
    ("device,start_min,end_min,cpu_share,up_kbit_s,down_kbit_s,online", "start_min", "unknown time unit 'min'"),
    ("device,start_s,end_round,cpu_share,up_kbit_s,down_kbit_s,online", "end_round", "unit differs from start_s"),
    ("device,start_s,end_s,cpu,up_kbit_s,down_kbit_s,online", "cpu", "expected column 'cpu_share' here"),
    ("device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s", "header", "6 columns, expected 7"),
    ("device,begin_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online", "begin_s", "expected start_s or start_round"),
])
def test_a_bad_header_names_the_column(tmp_path: Path, header: str, field: str, problem: str) -> None:
    path = _write(tmp_path, "# comment\n" + header + "\ndev-0,0,1,1,1,1,1\n")
    with pytest.raises(TraceFormatError) as info:
        read_timeline(path)
    assert str(info.value).startswith(f"{path}:2: field '{field}': ") and problem in str(info.value)


def test_round_ids_must_be_integers(tmp_path: Path) -> None:
    path = _write(tmp_path, "device,start_round,end_round,cpu_share,up_kbit_s,down_kbit_s,online\n"
                            "dev-0,1,2.5,1,1,1,1\n")
    with pytest.raises(TraceFormatError, match=r"t.csv:2: field 'end_round': value '2.5' is not an integer"):
        read_timeline(path)


@pytest.mark.parametrize("text, line, field, problem", [
    ("", 1, "header", "no header"),
    ("# only a comment\n", 2, "header", "no header"),
    (HEADER, 2, "device", "no data rows"),
    (HEADER + "dev-0,0,1,1,1,1,1\n\ndev-0,1,2,1,1,1,1\n", 3, "device", "blank line inside the data"),
])
def test_empty_or_broken_files_name_where(tmp_path: Path, text: str, line: int, field: str, problem: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(TraceFormatError) as info:
        read_timeline(path)
    assert str(info.value).startswith(f"{path}:{line}: field '{field}': ") and problem in str(info.value)


def test_text_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(HEADER.encode() + b"dev-0,0,1,1,1,1,1\ndev-\xff,1,2,1,1,1,1\n")
    with pytest.raises(TraceFormatError, match=r"t.csv:3: field 'header': not UTF-8"):
        read_timeline(path)


def test_a_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read"):
        read_timeline(tmp_path / "absent.csv")


def test_constructed_timelines_are_checked_by_the_same_rules() -> None:
    with pytest.raises(TraceFormatError, match=r"field 'cpu_share': value -0.1 is negative"):
        Conditions(cpu_share=-0.1, up_kbit_s=1, down_kbit_s=1, online=True)
    ok = Conditions(1.0, 1.0, 1.0, True)
    with pytest.raises(TraceFormatError, match=r"device 'dev-0': interval 2: field 'start': .* overlaps"):
        Timeline(unit=TimeUnit.SECOND, devices={"dev-0": (Interval(0, 10, ok), Interval(5, 20, ok))})
    with pytest.raises(TraceFormatError, match=r"field 'end': value 2.5 is not an integer"):
        Timeline(unit=TimeUnit.ROUND, devices={"dev-0": (Interval(1, 2.5, ok),)})


def test_a_value_with_control_characters_is_shown_escaped_on_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER + "dev-0,0,1,0.5\x01\r5,1,1,1\n")
    with pytest.raises(TraceFormatError) as info:
        read_timeline(path)
    assert str(info.value) == f"{path}:2: field 'cpu_share': value '0.5\\x01\\r5' is not a number"
