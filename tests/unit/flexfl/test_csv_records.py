"""flexfl.csv_records: a CSV read into typed records, and one error line naming file:line and column."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flexfl.csv_records import converted, read_records
from flexfl.errors import ConfigError, ReportError


def _rounds(text: str) -> int | None:
    return None if text == "never" else int(text)


@dataclass(frozen=True)
class Run:
    seed: int
    loss: float
    acc: float | None
    ok: bool
    name: str
    cross: int | None = field(metadata=converted(_rounds, expected="a round count or 'never'"))
    pair: tuple[float, float] = field(metadata=converted(lambda t: (float(t[0]), float(t[1])), columns=("a", "b"),
                                                         expected="two numbers"))
    note: str | None = None


@dataclass(frozen=True)
class Line:
    dataset: str
    run: Run


HEADER = "seed,loss,acc,ok,name,cross,a,b,choice_T200,dataset\n"


def _write(tmp_path: Path, *lines: str, header: str = HEADER) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text(header + "".join(line + "\n" for line in lines))
    return path


def test_each_column_is_converted_by_its_fields_type_and_an_absent_optional_column_keeps_its_default(tmp_path):
    path = _write(tmp_path, "3,0.5,,True,x,never,0.1,1,auto,mnist", "4,nan,NaN,0,y,12,1,2,x,synthetic")
    first, second = read_records(path, Run)
    assert first == Run(seed=3, loss=0.5, acc=None, ok=True, name="x", cross=None, pair=(0.1, 1.0))
    assert second.acc is None and second.loss != second.loss and second.ok is False and second.cross == 12
    assert [line.run.seed for line in read_records(path, Line)] == [3, 4]  # a nested record, from the same line
    assert read_records(path, Line)[1].dataset == "synthetic"


def test_a_bad_value_names_file_line_column_and_text(tmp_path):
    path = _write(tmp_path, "3,0.5,,True,x,never,0.1,1,a,m", "4,0.5,,maybe,x,never,0.1,1,a,m")
    with pytest.raises(ReportError, match=r"runs\.csv:3: column 'ok': expected True or False, got 'maybe'$"):
        read_records(path, Run)
    path = _write(tmp_path, "ten,0.5,,True,x,never,0.1,1,a,m")
    with pytest.raises(ReportError, match=r"runs\.csv:2: column 'seed': expected int, got 'ten'$"):
        read_records(path, Run)
    path = _write(tmp_path, "1,0.5,0.x,True,x,never,0.1,1,a,m")
    with pytest.raises(ReportError, match=r"runs\.csv:2: column 'acc': expected float or empty, got '0\.x'$"):
        read_records(path, Run)
    path = _write(tmp_path, "1,0.5,,True,x,soon,0.1,1,a,m")
    with pytest.raises(ReportError, match=r"csv:2: column 'cross': expected a round count or 'never', got 'soon'$"):
        read_records(path, Run)
    path = _write(tmp_path, "1,0.5,,True,x,2,0.1,one,a,m")
    with pytest.raises(ReportError, match=r"csv:2: columns 'a', 'b': expected two numbers, got \('0\.1', 'one'\)$"):
        read_records(path, Run)


def test_a_missing_column_or_short_line_is_an_error_and_the_error_class_is_the_callers(tmp_path):
    path = _write(tmp_path, "3,0.5,,True,x,never,0.1", header="seed,loss,acc,ok,name,cross,a\n")
    with pytest.raises(ConfigError, match=r"runs\.csv:1: missing column 'b'$"):
        read_records(path, Run, error=ConfigError)
    path = _write(tmp_path, "3,0.5,,True,x,never,0.1")
    with pytest.raises(ReportError, match=r"runs\.csv:2: column 'b': missing \(the line is short\)"):
        read_records(path, Run)
    with pytest.raises(ReportError, match=r"nowhere\.csv: cannot read"):
        read_records(tmp_path / "nowhere.csv", Run)


def test_columns_maps_a_field_to_a_column_of_another_name(tmp_path):
    @dataclass(frozen=True)
    class Choice:
        choice: str

    path = _write(tmp_path, "3,0.5,,True,x,never,0.1,1,exclude,m")
    assert read_records(path, Choice, columns={"choice": "choice_T200"}) == [Choice("exclude")]
    with pytest.raises(ReportError, match=r"missing column 'choice'"):
        read_records(path, Choice)


def test_a_field_of_a_type_without_a_conversion_is_refused_when_the_reader_is_built(tmp_path):
    @dataclass(frozen=True)
    class Odd:
        values: list[int]

    with pytest.raises(TypeError, match=r"Odd\.values: no CSV conversion"):
        read_records(_write(tmp_path), Odd)
