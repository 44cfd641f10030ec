"""One config layer for every FlexFL config file: typed dataclasses <-> TOML.

Precedence: dataclass defaults < TOML file < overrides (command-line flags). Configs are
frozen dataclasses; nested dataclasses are TOML tables, tuples of dataclasses arrays of
tables. Supported field types: bool, int, float, str, StrEnum, `X | None` (None = key
absent), tuple[X, ...], dict[str, X] and nested dataclasses. Files are written by dumping the
dataclasses (`dump_toml`, `write_config`), never by formatting strings.

An `Enum | str` field holds a member of the enum when the value is one of its values, else
the string: a built-in name or a plug-in's (flexfl.plugins), which the config's own
validation resolves.

Field metadata:
- PATH: a filesystem path. A relative path read from a file is made absolute against the
  file's folder, so a config means the same wherever it is run from.
- IMPORT_PATH: a PATH (a config's `plugin_path`) that load_config puts first on sys.path
  before it builds the config, so that the plug-ins the config names import while it is
  validated.
- NOT_IN_FILE: set by code (e.g. a secret given inline by a test); never read nor written.

Errors name the file, the table, the key, the value and the valid choices, and suggest a
key for a misspelt one: `c.toml: [run].roundz: unknown key; did you mean 'rounds'?`.

A config class may declare (as class attributes, docs/config.md lists them):
- MOVED_KEYS {old key: Moved("table.key")}: a key that moved to another table. A file with it in
  the old place reads (the same value) when Moved.read, else it is refused with the new form
  shown; given in both places, it is refused.
- EXCLUSIVE_KEYS {(key, key): advice}: keys of one table that a file gives one of at most (a
  flag or a table's default yields to the file's partner); the one left at its default is left
  out of a written file.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import math
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from flexfl.errors import ConfigError
from flexfl.files import atomic_file

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

PATH = {"path": True}
IMPORT_PATH = {"path": True, "import_path": True}
NOT_IN_FILE = {"in_file": False}
FLAGS_WHERE = "command line"  # what an error names when the value came from an override (a flag)


@dataclasses.dataclass(frozen=True)
class Moved:
    """Where an older key of a config table is now: `to` is "table.key" (relative to the old key's table).

    read: a file that still has the key in its old place reads, with the same value; else it is
    refused, with the new form shown."""

    to: str
    read: bool = True


def path_field(default: str = "") -> Any:
    """A dataclass field holding a path (relative values in a file resolve against its folder)."""
    return dataclasses.field(default=default, metadata=PATH)


def plugin_path_field() -> Any:
    """A config's `plugin_path`: a folder put first on sys.path so that the plug-ins it names import.

    Where this machine keeps code, not what the run is: never compared, and left out of a
    file when not set (None)."""
    return dataclasses.field(default=None, compare=False, metadata=IMPORT_PATH)


# ---- reading ---------------------------------------------------------------------------------


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; an unreadable, binary or malformed file is a ConfigError naming it."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); expected a TOML config") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def load_config(cls: type[T], path: Path | None = None, *, overrides: Mapping[str, Any] | None = None,
                defaults: Mapping[str, Any] | None = None) -> T:
    """Dataclass defaults < `defaults` (a command's own) < the TOML file at `path` < `overrides`.

    `defaults` and `overrides` are {key: value or {table: ...}}; None values mean "not
    given" and are skipped (argparse's defaults). An error names the file, or the command
    line when the config is valid without the overrides.
    """
    raw: dict[str, Any] = {}
    if defaults:
        _merge(raw, defaults)
    where = "config"
    if path is not None:
        where = str(path)
        from_file = dict(moved_keys(cls, read_toml(path), where=where))
        _check_exclusive(cls, from_file, where=where)
        _resolve_paths(cls, from_file, Path(path).resolve().parent)
        _yield_partners(cls, raw, from_file)
        _merge(raw, from_file)
    if not overrides:
        _add_import_folders(cls, raw, where=where)
        return from_dict(cls, raw, where=where)
    with_flags = copy.deepcopy(raw)
    _yield_partners(cls, with_flags, overrides)
    _merge(with_flags, overrides)
    _add_import_folders(cls, with_flags, where=where)
    try:
        return from_dict(cls, with_flags, where=where)
    except ConfigError:
        if not _valid(cls, raw):
            raise  # the file (or the command's defaults) is wrong by itself: the file keeps the blame
    # Valid without the overrides: a flag is wrong (`--coordinator localhost` was blamed on the file).
    return from_dict(cls, with_flags, where=FLAGS_WHERE)


def _add_import_folders(cls: type, raw: Mapping[str, Any], *, where: str) -> None:
    # Before the config is built: its validation imports the plug-ins it names.
    from flexfl.plugins import add_import_folder

    for f in dataclasses.fields(cls):
        value = raw.get(f.name)
        if f.metadata.get("import_path") and isinstance(value, str) and value:
            add_import_folder(value, where=where)


def _valid(cls: type, raw: Mapping[str, Any]) -> bool:
    try:
        from_dict(cls, raw)
    except ConfigError:
        return False
    return True


def moved_keys(cls: type, raw: Mapping[str, Any], *, where: str, table: str = "") -> Mapping[str, Any]:
    """`raw` (a table of `cls`) with its older keys in their new places (cls.MOVED_KEYS); a key given in both
    places, or one whose old place no longer reads, is a ConfigError (the latter shows the new form)."""
    moved: Mapping[str, Moved] = getattr(cls, "MOVED_KEYS", {})
    old = [key for key in moved if key in raw]
    if not old:
        return raw
    out = dict(raw)
    refused: dict[str, dict[str, Any]] = {}  # new table -> {key: value}: the form to write instead
    for key in old:
        new_table, _, new_key = moved[key].to.rpartition(".")
        new_path = f"{table}.{new_table}" if table else new_table
        dest = out.get(new_table)
        if dest is not None and not isinstance(dest, Mapping):
            raise ConfigError(f"{where}: {_table(new_path)}: expected a table, got {_show(dest)}")
        if isinstance(dest, Mapping) and new_key in dest:
            raise ConfigError(f"{where}: {_key(table, key)} and {_key(new_path, new_key)} both given (the first is "
                              f"the older place of the second); keep {_key(new_path, new_key)}")
        value = out.pop(key)
        if not moved[key].read:
            refused.setdefault(new_path, {})[new_key] = value
        else:
            out[new_table] = {**(dest if isinstance(dest, Mapping) else {}), new_key: value}
    if refused:
        import tomli_w

        keys = ", ".join(k for k in old if not moved[k].read)
        where_now = " and ".join(_table(t) for t in refused)
        new_form = "".join(f"[{t}]\n{tomli_w.dumps(values)}" for t, values in refused.items())
        raise ConfigError(f"{where}: {keys} {'in [' + table + ']' if table else 'at the top level'} moved to "
                          f"{where_now} (docs/config.md); write\n{new_form.rstrip()}")
    return out


def _exclusive(cls: type) -> Mapping[tuple[str, ...], str]:
    return getattr(cls, "EXCLUSIVE_KEYS", {})


def _check_exclusive(cls: type, raw: Mapping[str, Any], *, where: str, table: str = "") -> None:
    """One line when `raw` (a table of `cls`, or a nested table's) gives two keys of one EXCLUSIVE_KEYS pair."""
    for keys, advice in _exclusive(cls).items():
        given = [k for k in keys if k in raw]
        if len(given) > 1:
            raise ConfigError(f"{where}: {_table(table) + ' ' if table else ''}{' and '.join(given)} both given; "
                              f"give one ({advice})")
    for name, tp in _table_types(cls).items():
        if isinstance(raw.get(name), Mapping):
            _check_exclusive(tp, raw[name], where=where, table=f"{table}.{name}" if table else name)


def _table_types(cls: type) -> dict[str, type]:
    """The fields of `cls` that are nested config tables (dataclasses), by name."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        tp = _unwrap_optional(hints[f.name])
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out[f.name] = tp
    return out


def _yielding(cls: type, over: Mapping[str, Any]) -> set[str]:
    """Keys of a `cls` table that yield to `over` (the layer above): their EXCLUSIVE_KEYS partner is in it."""
    return {k for keys in _exclusive(cls) if any(over.get(k2) is not None for k2 in keys) for k in keys
            if over.get(k) is None}


def _without_partners(cls: type, under: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`under` (a table's lower layer: its default) without the keys that yield to `over`."""
    drop = _yielding(cls, over)
    return {k: v for k, v in under.items() if k not in drop}


def _yield_partners(cls: type, under: dict[str, Any], over: Mapping[str, Any]) -> None:
    """Before `over` is merged into `under` (the file over defaults, flags over the file): drop from `under`
    (and its tables) the keys that yield to `over` (--scheme A replaces the file's strategy)."""
    for key in _yielding(cls, over) & set(under):
        del under[key]
    for name, tp in _table_types(cls).items():
        if isinstance(under.get(name), dict) and isinstance(over.get(name), Mapping):
            _yield_partners(tp, under[name], over[name])


def from_dict(cls: type[T], raw: Mapping[str, Any], *, where: str = "config", table: str = "") -> T:
    """Build dataclass `cls` from plain values (a parsed TOML or JSON document), checking every key."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: {_table(table) or 'config'}: expected a table, got {_show(raw)}")
    raw = moved_keys(cls, raw, where=where, table=table)
    _check_exclusive(cls, raw, where=where, table=table)
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("in_file", True)}
    for key in raw:
        if key not in known:
            hint = difflib.get_close_matches(str(key), list(known), n=1)
            suggestion = f"did you mean '{hint[0]}'? " if hint else ""
            raise ConfigError(f"{where}: {_key(table, key)}: unknown key; {suggestion}valid keys: {', '.join(known)}")
    values = {}
    for name, f in known.items():
        if name in raw:
            value = raw[name]
            default = _default(f)
            if dataclasses.is_dataclass(default) and isinstance(value, Mapping):
                # A partial table changes only its keys of the field's default (which may differ
                # from the nested class's own defaults, e.g. a simulation's 50 devices).
                # Older keys moved first: the default's new-form keys are no "both given"
                value = moved_keys(type(default), value, where=where, table=f"{table}.{name}" if table else name)
                value = {**_without_partners(type(default), to_dict(default), value), **value}
            values[name] = _convert(hints[name], value, where=where, table=table, key=name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: {_key(table, name)}: missing (required)")
    try:
        return cls(**values)
    except ConfigError as exc:
        # Validation in __post_init__ names keys; say which file and table they came from (same class: a PluginError
        # stays one).
        raise type(exc)(f"{where}: {_table(table) + ' ' if table else ''}{exc}") from None


def replace_from_table(obj: T, raw: Mapping[str, Any], *, where: str, table: str, check_required: bool = True) -> T:
    """`obj` (a frozen dataclass) with the fields a config table `raw` gives, each checked as from_dict checks it.

    A strategy's parameters are read so ([rules.strategy]'s keys beside `name`): a field is a
    key unless its metadata says in_file = False, and one whose metadata has "required" (a
    text saying what it is) must be given when `check_required`. `where` "" leaves the file out
    of messages (a config built in code, or one whose file a caller names)."""
    at = f"{where}: " if where else ""
    known = {f.name: f for f in dataclasses.fields(obj) if f.metadata.get("in_file", True)}
    for key in raw:
        if key not in known:
            hint = difflib.get_close_matches(str(key), list(known), n=1)
            suggestion = f"did you mean '{hint[0]}'? " if hint else ""
            valid = f"valid keys: {', '.join(known)}" if known else "it has no parameters"
            raise ConfigError(f"{at}{_key(table, key)}: unknown key; {suggestion}{valid}")
    missing = [name for name, f in known.items() if check_required and f.metadata.get("required") and name not in raw]
    if missing:
        what = known[missing[0]].metadata["required"]
        raise ConfigError(f"{at}{_key(table, missing[0])}: missing (required): {what}")
    hints = typing.get_type_hints(type(obj))
    values = {key: _convert(hints[key], value, where=where or "config", table=table, key=key)
              for key, value in raw.items()}
    try:
        return dataclasses.replace(obj, **values)
    except ConfigError as exc:
        raise type(exc)(f"{at}{_table(table)} {exc}") from None


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _convert(tp: Any, value: Any, *, where: str, table: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        for option in options[:-1]:  # `Enum | str`: the enum's member if it is one, else the string
            try:
                return _convert(option, value, where=where, table=table, key=key)
            except ConfigError:
                pass
        return _convert(options[-1], value, where=where, table=table, key=key)
    if isinstance(tp, type) and callable(getattr(tp, "from_config", None)):
        # A table that reads itself (a strategy's: its name picks the class whose fields its other keys are)
        reader: Callable[..., Any] = getattr(tp, "from_config")  # noqa: B009 - checked above; mypy sees a type
        return reader(value, where=where, table=f"{table}.{key}" if table else key)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where=where, table=f"{table}.{key}" if table else key)
    if origin is dict:
        (_key_type, item) = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: {_key(table, key)}: expected a table, got {_show(value)}")
        return {str(k): _convert(item, v, where=where, table=f"{table + '.' if table else ''}{key}", key=str(k))
                for k, v in value.items()}
    if origin is tuple:
        (item, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: {_key(table, key)}: expected a list, got {_show(value)}")
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            return tuple(from_dict(item, v, where=where, table=f"{table + '.' if table else ''}{key}[{i}]")
                         for i, v in enumerate(value))
        return tuple(_convert(item, v, where=where, table=table, key=f"{key}[{i}]") for i, v in enumerate(value))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            choices = ", ".join(str(m.value) for m in tp)
            raise ConfigError(f"{where}: {_key(table, key)}: expected one of {choices}, got {_show(value)}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {_key(table, key)}: expected true or false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {_key(table, key)}: expected an integer, got {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where}: {_key(table, key)}: expected a finite number, got {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {_key(table, key)}: expected a string, got {_show(value)}")
        return value
    raise TypeError(f"flexfl.config cannot read fields of type {tp!r} ({_key(table, key)})")


def file_relative(cls: type, raw: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """A copy of `raw` (tables of a `cls` config, as a file holds them) whose relative path fields are taken
    relative to the folder `base`, as load_config takes a file's: for tables read from inside another file."""
    resolved = copy.deepcopy(dict(raw))
    _resolve_paths(cls, resolved, Path(base).resolve())
    return resolved


def _resolve_paths(cls: type, raw: dict[str, Any], base: Path) -> None:
    # Before overrides are merged: only values that came from the file are file-relative.
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        value, tp = raw[f.name], _unwrap_optional(hints[f.name])
        if f.metadata.get("path") and isinstance(value, str) and value and not Path(value).is_absolute():
            raw[f.name] = str(base / value)
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict):
            _resolve_paths(tp, value, base)
        elif typing.get_origin(tp) is tuple and isinstance(value, list):
            item = typing.get_args(tp)[0]
            if isinstance(item, type) and dataclasses.is_dataclass(item):
                for v in value:
                    if isinstance(v, dict):
                        _resolve_paths(item, v, base)


def merged(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Config tables layered as load_config layers them: later layers win key by key, tables merge, None is "not
    given"."""
    out: dict[str, Any] = {}
    for layer in layers:
        _merge(out, copy.deepcopy(dict(layer)))
    return out


def _merge(into: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            sub = into.setdefault(key, {})
            if isinstance(sub, dict):
                _merge(sub, value)
                continue
        if value is not None:
            into[key] = value


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _table(table: str) -> str:
    return f"[{table}]" if table else ""


def _key(table: str, key: str) -> str:
    return f"[{table}].{key}" if table else key


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- writing ---------------------------------------------------------------------------------


def to_dict(obj: Any, *, absolute_paths: bool = False) -> dict[str, Any]:
    """Plain TOML/JSON values of a config dataclass: enums as values, tuples as lists, None omitted.

    A field with metadata `written_when=V` is written only when its value is V (a switch added
    after runs were saved, at its default elsewhere: those runs' files stay byte-equal).

    With `absolute_paths`, relative path fields (relative to the working directory, as code
    holds them) are made absolute, so that a file written here means the same when read.
    """
    out: dict[str, Any] = {}
    left_out = _left_out(obj)
    for f in dataclasses.fields(obj):
        if not f.metadata.get("in_file", True) or f.name in left_out:
            continue
        value = _plain(getattr(obj, f.name), absolute_paths)
        if "written_when" in f.metadata and value != f.metadata["written_when"]:
            continue  # a field added later, written only where it changes a run (older files stay equal)
        if absolute_paths and f.metadata.get("path") and isinstance(value, str) and value:
            value = str(Path(value).absolute())
        if value is not None:
            out[f.name] = value
    return out


def _left_out(obj: Any) -> set[str]:
    """Fields a written file leaves out: of an EXCLUSIVE_KEYS pair, those at their default while a partner is set."""
    out: set[str] = set()
    if not _exclusive(type(obj)):
        return out
    defaults = {f.name: _default(f) for f in dataclasses.fields(obj)}
    for keys in _exclusive(type(obj)):
        set_ = [k for k in keys if getattr(obj, k) is not None and getattr(obj, k) != defaults[k]]
        if set_:
            out.update(k for k in keys if k not in set_)
    return out


def _plain(value: Any, absolute_paths: bool = False) -> Any:
    if callable(getattr(value, "to_config", None)):  # a table that reads itself (_convert's from_config)
        return value.to_config()
    if dataclasses.is_dataclass(value):
        return to_dict(value, absolute_paths=absolute_paths)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v, absolute_paths) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, absolute_paths) for k, v in value.items()}
    return value


def dump_toml(obj: Any, *, header: str = "") -> str:
    """The TOML text of a config dataclass, with `header` as leading comment lines (paths absolute)."""
    import tomli_w

    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + tomli_w.dumps(to_dict(obj, absolute_paths=True))


def write_config(path: Path, obj: Any, *, header: str = "", perms: int = 0o644) -> Path:
    """Write `obj` as TOML atomically (perms 0o600 for files that hold a secret)."""
    with atomic_file(Path(path), perms=perms) as f:
        f.write(dump_toml(obj, header=header))
    return Path(path)


def write_toml(path: Path, tables: Mapping[str, Any]) -> Path:
    """Write plain tables (not a config dataclass, e.g. a protocol's choices) as TOML, atomically."""
    import tomli_w

    with atomic_file(Path(path)) as f:
        f.write(tomli_w.dumps(dict(tables)))
    return Path(path)


# ---- command-line flags ----------------------------------------------------------------------

FLAG_PREFIX = "cfg."


def flag_dest(*path: str) -> str:
    """argparse `dest` of a flag that overrides config field `path` ("run", "rounds")."""
    return FLAG_PREFIX + ".".join(path)


def enum_choices(members: Iterable[enum.Enum]) -> list[str]:
    """argparse `choices` from their owner, an enum or a tuple of its members: the values as plain strings
    (an error then lists 'A', 'B', not <Scheme.A: 'A'>)."""
    return [str(member.value) for member in members]


def overrides_from_args(args: Any) -> dict[str, Any]:
    """The {table: {key: value}} overrides of an argparse Namespace's flag_dest() flags that were given."""
    out: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if not dest.startswith(FLAG_PREFIX) or value is None:
            continue
        *tables, key = dest[len(FLAG_PREFIX):].split(".")
        node = out
        for t in tables:
            node = node.setdefault(t, {})
        node[key] = value.value if isinstance(value, enum.Enum) else value
    return out


def coerce_enums(obj: Any) -> None:
    """In a frozen config's __post_init__: turn str values of enum-typed fields into the enum.

    Code may build configs with plain strings (RulesConfig(scheme="A")); after this every
    enum field holds its enum, and a bad value is a ConfigError naming the choices.
    An `Enum | str` field keeps a string that is not one of the enum's values (a plug-in's name).
    """
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        tp = _unwrap_optional(hints[f.name])
        value = getattr(obj, f.name)
        if isinstance(tp, type) and issubclass(tp, enum.Enum) and value is not None and not isinstance(value, tp):
            try:
                object.__setattr__(obj, f.name, tp(value))
            except ValueError:
                if str in typing.get_args(hints[f.name]) and isinstance(value, str):
                    continue
                choices = ", ".join(str(m.value) for m in tp)
                raise ConfigError(f"{f.name}: expected one of {choices}, got {_show(value)}") from None
