"""A CSV file read into frozen dataclass records: one field per column, converted by the field's type.

A committed CSV (a page's runs, a run's rounds.csv) is read back through its record class alone
(issue 32: one shape for each fact), so a renamed column or a bad cell fails at the file's line,
naming the column and the text, not as a KeyError or a ValueError deep in page code.

Types: int, float, str, bool ("True"/"False", "true"/"false", "1"/"0"); `X | None` reads an empty
cell or "nan" (any case) as None. A field of another type, or a cell in another notation ("never"
for a round that did not come), takes its converter from `field(metadata=converted(...))`; a
field of a dataclass type is read from that record's columns in the same line. A column may be
absent from the file only where its field has a default. No torn-last-line leniency: these files
are written atomically (flexfl.files.atomic_file), so a short line is an error.
"""

from __future__ import annotations

import csv
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from flexfl.errors import FlexFLError, ReportError

T = TypeVar("T")
NONE_TEXTS = ("", "nan")  # an optional field's None, compared in lower case
_CONVERT, _COLUMNS, _EXPECTED = "csv_convert", "csv_columns", "csv_expected"
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


def converted(convert: Callable[[Any], Any], *, expected: str, columns: Sequence[str] = ()) -> dict[str, Any]:
    """The metadata of a record field read with `convert` instead of by its type:
    `rounds: dict[str, int | None] = field(metadata=converted(...))`.

    Without `columns`, `convert` takes the field's own cell (text -> value); with them, the texts
    of those columns as a tuple, in that order. It raises ValueError on text it does not take;
    `expected` says in words what it takes."""
    return {_CONVERT: convert, _COLUMNS: tuple(columns), _EXPECTED: expected}


@dataclasses.dataclass(frozen=True)
class _Cells:
    """How one field is read: from which columns, and the function of their texts that gives its value."""

    field: str
    columns: tuple[str, ...]
    convert: Callable[[tuple[str, ...]], Any]
    expected: str  # what a good cell is, for the error message
    optional: bool  # the field has a default: its columns may be absent
    record: type | None = None  # a field of a dataclass type: read by `plan` from the same line
    plan: tuple[_Cells, ...] = ()


def read_records(path: Path | str, cls: type[T], *, columns: Mapping[str, str] | None = None,
                 error: type[FlexFLError] = ReportError) -> list[T]:
    """The lines of the CSV file `path` as `cls` records (a dataclass), one per line.

    `columns` maps a field to its column where the names differ. Any unreadable file, missing
    column or bad cell raises `error` with one line: `path:line: column 'name': ..., got 'text'`."""
    path = Path(path)
    plan = _plan(cls, columns or {})
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = set(reader.fieldnames or ())
            missing = sorted({c for cells in _flat(plan) if not cells.optional for c in cells.columns} - header)
            if missing:
                raise error(f"{path}:1: missing {_named(missing)}")
            return [_build(cls, plan, line, header, f"{path}:{reader.line_num}", error) for line in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise error(f"{path}: cannot read: {exc}") from None


def _plan(cls: type, columns: Mapping[str, str]) -> tuple[_Cells, ...]:
    """How each field of `cls` is read (TypeError for a field of a type without a conversion)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        hint = hints[f.name]
        own = (columns.get(f.name, f.name),)
        if _CONVERT in f.metadata:
            convert, several = f.metadata[_CONVERT], f.metadata[_COLUMNS]
            plan.append(_Cells(f.name, several or own, convert if several else _one(convert),
                               f.metadata[_EXPECTED], optional))
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            plan.append(_Cells(f.name, (), _one(str), "", optional, record=hint, plan=_plan(hint, columns)))
        else:
            convert, expected = _by_type(hint, f"{cls.__name__}.{f.name}")
            plan.append(_Cells(f.name, own, _one(convert), expected, optional))
    return tuple(plan)


def _flat(plan: Sequence[_Cells]) -> list[_Cells]:
    return [c for cells in plan for c in (_flat(cells.plan) if cells.record else [cells])]


def _one(convert: Callable[[str], Any]) -> Callable[[tuple[str, ...]], Any]:
    return lambda texts: convert(texts[0])


def _by_type(hint: Any, name: str) -> tuple[Callable[[str], Any], str]:
    """The converter of a field's type, and what it takes in words."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"{name}: no CSV conversion for {hint!r}; give it one with converted()")
        inner, expected = _by_type(rest[0], name)
        return (lambda text: None if text.strip().lower() in NONE_TEXTS else inner(text)), f"{expected} or empty"
    if hint is bool:
        return _bool, "True or False"
    if hint in (int, float, str):
        return hint, hint.__name__
    raise TypeError(f"{name}: no CSV conversion for {hint!r}; give it one with converted()")


def _bool(text: str) -> bool:
    try:
        return _BOOLS[text.strip().lower()]
    except KeyError:
        raise ValueError(text) from None


def _build(cls: type[T], plan: Sequence[_Cells], line: Mapping[str, str | None], header: set[str], where: str,
           error: type[FlexFLError]) -> T:
    values: dict[str, Any] = {}
    for cells in plan:
        if cells.record is not None:
            values[cells.field] = _build(cells.record, cells.plan, line, header, where, error)
            continue
        if not set(cells.columns) <= header:
            continue  # an optional field's column is not in this file: its default stands
        texts = tuple(line.get(c) for c in cells.columns)
        short = [c for c, text in zip(cells.columns, texts) if text is None]
        if short:
            raise error(f"{where}: {_named(short)}: missing (the line is short)")
        try:
            values[cells.field] = cells.convert(typing.cast(tuple[str, ...], texts))
        except (ValueError, TypeError):
            got = texts[0] if len(texts) == 1 else texts
            raise error(f"{where}: {_named(cells.columns)}: expected {cells.expected}, got {got!r}") from None
    return cls(**values)


def _named(columns: Sequence[str]) -> str:
    """"column 'a'", "columns 'a', 'b'"."""
    return f"column{'s' if len(columns) > 1 else ''} {', '.join(map(repr, columns))}"
