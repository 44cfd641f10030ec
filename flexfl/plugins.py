"""Plug-ins: a user's model, dataset or strategy, named in a config by import path or entry point.

A name that is not a built-in one names a plug-in:
- "MODULE:ATTRIBUTE", an import path written as in entry points: MODULE is imported from
  sys.path (an installed package, or the folder a config's `plugin_path` puts first on it)
  and ATTRIBUTE (dotted for a nested name) is taken from it;
- a bare name: the entry point of that name in the kind's group (`flexfl.models`,
  `flexfl.datasets`, `flexfl.strategies`) of an installed package.
Built-in names are looked up first, so a plug-in never shadows one.

An agent runs the dataset and the model its coordinator names. So that a coordinator cannot
make it import any module on its path and call any function there, `flexfl agent` calls
trust_only_plugin_path(): an import path must then lead into a folder of the agent's own
`plugin_path` (an installed package's entry points are trusted as they are declared).

Each owner resolves its names here and checks what it gets (workloads.models.build_model,
workloads.datasets.dataset_plugin, coordinator.rules.strategies.get_strategy). Every failure (not
importable, a missing attribute, a wrong result, an exception raised in the plug-in's own
code) is one PluginError line that names the plug-in and what it lacks or what failed.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import sys
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexfl.errors import ConfigError, PluginError

_MAX_LINE = 400  # characters of an error message taken from a plug-in's exception


@dataclass(frozen=True)
class PluginKind:
    """A kind of plug-in: what messages call it, its entry point group, and what its name must lead to."""

    what: str
    group: str
    expects: str


MODEL = PluginKind("model", "flexfl.models", "a torch.nn.Module class, or a function that returns a module")
DATASET = PluginKind("dataset", "flexfl.datasets", "a function (or class) called with no arguments that returns the "
                                                   "data: x_train, y_train, x_test, y_test, num_classes")
STRATEGY = PluginKind("strategy", "flexfl.strategies", "a class with arrival_weights(*, s, E, p) and "
                                                       "round_scale(*, s, E, p) (coordinator.rules.strategy.Strategy)")

# What a config key holding a plug-in's name takes beside the built-in names (for messages).
PLUGIN_FORMS = "or a plug-in: MODULE:ATTRIBUTE, or the name of an installed {group} entry point"


def plugin_forms(kind: PluginKind) -> str:
    """'or a plug-in: MODULE:ATTRIBUTE, or ...': how errors and help texts say a name may name a plug-in."""
    return PLUGIN_FORMS.format(group=kind.group)


@dataclass(frozen=True)
class Plugin:
    """A resolved plug-in: the object its name leads to, and how to blame it."""

    kind: PluginKind
    name: str  # as the config wrote it: "mypkg.models:TinyNet" or an entry point's name
    obj: Any
    folder: str | None  # the folder of the module that defines it, as its frames name it in a traceback

    def error(self, problem: str) -> PluginError:
        """PluginError "<kind> plug-in '<name>' <problem>", on one line."""
        return PluginError(_one_line(f"{self.kind.what} plug-in {self.name!r} {problem}"))

    @contextmanager
    def calling(self, doing: str) -> Iterator[None]:
        """Run the plug-in's own code: an exception in it becomes one PluginError line naming it, `doing` and where."""
        try:
            yield
        except PluginError:
            raise
        except Exception as exc:
            raise self.error(f"raised {_describe(exc)} in {doing}{_where(exc, self.folder)}") from exc

    @property
    def short_name(self) -> str:
        """The attribute's own name ("TinyNet" of "mypkg.models:TinyNet"); an entry point's name as it is."""
        return self.name.rpartition(":")[2].rpartition(".")[2] or self.name


def is_import_path(name: str) -> bool:
    """`name` has the MODULE:ATTRIBUTE form of an import path."""
    return ":" in name


# Folders that configs' plugin_path put on sys.path, and whether import paths must lead into one of them (agents).
_PLUGIN_FOLDERS: list[Path] = []
_ONLY_PLUGIN_PATH = False


def trust_only_plugin_path() -> None:
    """From now on, in this process, an import path must lead into a plugin_path folder (`flexfl agent` calls it)."""
    global _ONLY_PLUGIN_PATH
    _ONLY_PLUGIN_PATH = True


def resolve(kind: PluginKind, name: str) -> Plugin | None:
    """The plug-in `name` leads to: an import path, or an installed entry point of `kind`'s group.

    None when `name` is a bare name that no installed package declares (the caller says which
    built-in names exist). Call it only for names that are not built-in.
    """
    if is_import_path(name):
        module, _, attribute = name.partition(":")
        if _ONLY_PLUGIN_PATH:
            _check_in_plugin_path(kind, name, module.strip())
        return _load(kind, name, module.strip(), attribute.strip())
    point = next((ep for ep in importlib.metadata.entry_points(group=kind.group) if ep.name == name), None)
    if point is None:
        return None
    return _load(kind, name, point.module, point.attr or "")


def entry_point_names(kind: PluginKind) -> list[str]:
    """Names that installed packages declare in `kind`'s entry point group."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=kind.group)})


def _load(kind: PluginKind, name: str, module_name: str, attribute: str) -> Plugin:
    head = f"{kind.what} plug-in {name!r}"
    if not module_name or not attribute or not all(p.isidentifier() for p in module_name.split(".")) \
            or not all(p.isidentifier() for p in attribute.split(".")):
        raise PluginError(f"{head}: expected MODULE:ATTRIBUTE (e.g. mypkg.models:TinyNet), with Python names "
                          "on both sides")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise PluginError(_one_line(
                f"{head} cannot be imported here: no module named {missing!r}. A plug-in must be importable by "
                f"every program that uses it (simulator, coordinator and each agent): install its package there, or "
                f"set plugin_path in that program's config to the folder that holds {missing}")) from None
        raise PluginError(_one_line(f"{head}: importing {module_name} raised {_describe(exc)}"
                                    f"{_where(exc, _module_folder(module_name))}")) from exc
    except Exception as exc:
        raise PluginError(_one_line(f"{head}: importing {module_name} raised {_describe(exc)}"
                                    f"{_where(exc, _module_folder(module_name))}")) from exc
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginError(_one_line(f"{head}: {module_name} has no attribute {attribute!r}{hint} "
                                        f"(it should be {kind.expects})"))
        obj = getattr(obj, part)
    origin = getattr(module, "__file__", None)
    return Plugin(kind=kind, name=name, obj=obj, folder=str(Path(origin).parent) if origin else None)


def add_import_folder(folder: str, *, where: str) -> None:
    """Put `folder` (a config's plugin_path) first on sys.path, so that its plug-ins import; once."""
    path = Path(folder)
    if not path.is_dir():
        raise ConfigError(f"{where}: plugin_path: {folder} is not a folder (it should hold the plug-ins' package)")
    resolved = path.resolve()
    if resolved not in _PLUGIN_FOLDERS:
        _PLUGIN_FOLDERS.append(resolved)
    if str(resolved) not in sys.path:
        sys.path.insert(0, str(resolved))
        importlib.invalidate_caches()  # the import system caches folder listings


def _check_in_plugin_path(kind: PluginKind, name: str, module_name: str) -> None:
    """Refuse an import path outside the plugin_path folders, before anything of it is imported."""
    top = module_name.partition(".")[0]
    try:
        spec = importlib.util.find_spec(top) if top.isidentifier() else None  # a top-level name: nothing runs
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return  # not importable at all: the import says so
    places = [Path(spec.origin).parent] if spec.origin else [Path(p) for p in spec.submodule_search_locations or ()]
    if not any(place.resolve().is_relative_to(folder) for place in places for folder in _PLUGIN_FOLDERS):
        where = ", ".join(map(str, _PLUGIN_FOLDERS)) or "none is set"
        raise PluginError(_one_line(
            f"{kind.what} plug-in {name!r} is outside this agent's plugin_path ({where}): an agent imports the "
            f"plug-ins its coordinator names only from there, or from an installed package's {kind.group} entry "
            f"points ({top} is in {places[0] if places else 'an unknown place'})"))


class PluginChoices(list):
    """argparse `choices`: the built-in names (listed by --help and in errors), and any plug-in name.

    A value is accepted when it is built-in, has the MODULE:ATTRIBUTE form, or is the name of
    an installed entry point of `kind`'s group; whether a plug-in imports is checked where the
    name is resolved (one PluginError line), not by argparse.
    """

    def __init__(self, names: Iterable[str], kind: PluginKind) -> None:
        super().__init__(names)
        self.kind = kind

    def __contains__(self, value: object) -> bool:
        if super().__contains__(value):
            return True
        return isinstance(value, str) and (is_import_path(value) or value in entry_point_names(self.kind))


def kind_of(value: object) -> str:
    """'a dict', 'an int': what a value is, for messages."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _where(exc: BaseException, folder: str | None) -> str:
    """' (models.py:23)': the innermost frame in `folder` (the plug-in's) of exc's traceback; '' if none.

    The innermost of the plug-in's own frames, not of the traceback: an error raised inside
    torch then points at the plug-in's line that called it.
    """
    if folder is None:
        return ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith(folder):
            return f" ({Path(frame.filename).name}:{frame.lineno})"
    return ""


def _module_folder(module_name: str) -> str | None:
    """The folder of a module that failed to import (its frames are the plug-in's), if it can be found."""
    try:
        spec = importlib.util.find_spec(module_name)
    except Exception:
        return None
    return str(Path(spec.origin).parent) if spec is not None and spec.origin else None


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_LINE else line[:_MAX_LINE - 3] + "..."
