"""A user's strategy behind checks that name it (coordinator.rules.strategies.get_strategy wraps every plug-in in it).

Kept apart from the built-in strategies: the checks on what a plug-in's two factors return,
and the one-line PluginError for an exception in its code, are not part of any rule.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from coordinator.rules.strategy import Strategy
from flexfl.config import replace_from_table
from flexfl.plugins import STRATEGY, Plugin, kind_of

if TYPE_CHECKING:
    import torch

    from coordinator.rules.memory import StrategyMemory

# Attributes that once asked FlexFL to run a rule for the plug-in, and the hook that is its own rule now.
_OLD_FLAGS = {"memory": "new_memory(*, like) returning a coordinator.rules.memory.StrategyMemory (MIFA's own: "
                        "coordinator.rules.memory.MIFAMemory)",
              "needs_steps": "counts_per_update(*, steps_per_update, n_samples) returning steps_per_update "
                             "(FedNova's)"}


class PluginStrategy(Strategy):
    """A user's strategy (a plug-in) behind checks that name it: FlexFL calls only this wrapper.

    The plug-in gives arrival_weights(*, s, E, p) and round_scale(*, s, E, p) as Strategy
    does (they get copies of the round's arrays), and may set label, title, proximal_mu and
    parameters (defaults: its class's name lowercased, its class's name, 0, none) and give
    Strategy's hooks new_memory (its own state between rounds, which makes each round's
    model) and counts_per_update (its own count of a device's work). Its name is the one
    [rules.strategy] gives. A weight must be a finite number >= 0 per device, a scale a
    finite number >= 0 or None (discard the round), a count an integer >= 1 per device, a
    memory's model finite and shaped like the model; anything else, or an exception in its
    code, is one PluginError line.
    """

    # The round a plug-in is first called on, before any run: devices that did nothing, part and all of E.
    _PROBE: ClassVar[dict[str, Any]] = {"s": np.array([0, 1, 2, 4], dtype=np.int64), "E": 4,
                                        "p": np.array([0.1, 0.2, 0.3, 0.4])}

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        impl: Any = plugin.obj
        if inspect.isclass(impl):
            abstract = sorted(getattr(impl, "__abstractmethods__", ()))
            if abstract:
                raise plugin.error(f"lacks {', '.join(abstract)} (abstract in its base class); {STRATEGY.expects}")
            with plugin.calling(f"{impl.__name__}()"):
                impl = impl()
        elif inspect.isroutine(impl):
            raise plugin.error(f"is a function; it should be {STRATEGY.expects}, or an instance of one")
        missing = [m for m in ("arrival_weights", "round_scale") if not callable(getattr(impl, m, None))]
        if missing:
            raise plugin.error(f"lacks {' and '.join(m + '(*, s, E, p)' for m in missing)}; it should be "
                               f"{STRATEGY.expects}")
        self.impl = impl
        label = getattr(impl, "label", None) or plugin.short_name.lower()
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", label):
            raise plugin.error(f"has label {label!r}; a label names its runs' folders and table rows: letters, digits, "
                               "'.', '_' and '-'")
        self._label = label
        self._title = str(getattr(impl, "title", None) or plugin.short_name)
        for flag, hook in _OLD_FLAGS.items():
            if getattr(impl, flag, None) is not None and not callable(getattr(impl, flag)):
                raise plugin.error(f"sets {flag} = {getattr(impl, flag)!r}, which FlexFL no longer reads: a strategy "
                                   f"runs its own rule; give it {hook}")
        with plugin.calling("its attributes (proximal_mu, parameters: {name: number})"):
            mu = getattr(impl, "proximal_mu", 0.0)
            own = getattr(impl, "parameters", None)
            if own is None and dataclasses.is_dataclass(impl):  # its fields are its parameters ([rules.strategy])
                own = {f.name: getattr(impl, f.name) for f in dataclasses.fields(impl)
                       if f.metadata.get("in_file", True)}
            self._parameters = {str(k): v if isinstance(v, str) else float(v) for k, v in dict(own or {}).items()}
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not (np.isfinite(mu) and mu >= 0):
            raise plugin.error(f"has proximal_mu = {mu!r}; it should be a number >= 0")
        self._mu = float(mu)
        self.arrival_weights(**self._PROBE)  # a wrong signature or result fails now, not in a run's round
        self.round_scale(**self._PROBE)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.plugin.name

    @property
    def label(self) -> str:  # type: ignore[override]
        return self._label

    @property
    def title(self) -> str:  # type: ignore[override]
        return self._title

    @property
    def proximal_mu(self) -> float:
        return self._mu

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self._parameters)

    def configure(self, params: Mapping[str, Any], *, where: str = "config", table: str = "rules.strategy",
                  check_required: bool = True) -> Strategy:
        """The plug-in with [rules.strategy]'s parameters: the fields of its frozen dataclass, as a built-in's."""
        if dataclasses.is_dataclass(self.impl) and not isinstance(self.impl, type):
            impl = replace_from_table(self.impl, params, where=where, table=table, check_required=check_required)
            return self if impl == self.impl else PluginStrategy(dataclasses.replace(self.plugin, obj=impl))
        if params:
            raise self.plugin.error(f"has no parameters, but [{table}] gives {', '.join(params)}; a strategy's "
                                    "parameters are the fields of its (frozen) dataclass")
        return self

    def new_memory(self, *, like: Mapping[str, torch.Tensor]) -> StrategyMemory | None:
        if not callable(getattr(self.impl, "new_memory", None)):
            return None
        with self.plugin.calling("new_memory"):
            memory = self.impl.new_memory(like=like)
        if memory is None:
            return None
        from coordinator.rules.plugin_memory import PluginMemory  # torch: only once a run starts

        return PluginMemory(self.plugin, memory, like=like)

    def counts_per_update(self, *, steps_per_update: np.ndarray, n_samples: np.ndarray) -> np.ndarray | None:
        if not callable(getattr(self.impl, "counts_per_update", None)):
            return None
        with self.plugin.calling("counts_per_update"):
            got = self.impl.counts_per_update(steps_per_update=steps_per_update.copy(), n_samples=n_samples.copy())
        if got is None:
            return None
        counts = np.asarray(got)
        if (counts.shape != steps_per_update.shape or not np.issubdtype(counts.dtype, np.integer)
                or (counts < 1).any()):
            raise self.plugin.error(f"returned {kind_of(got)} {np.asarray(got).tolist()!r} from counts_per_update for "
                                    f"{len(n_samples)} devices; expected one integer >= 1 per device, or None")
        return counts.astype(np.int64)

    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        return self.weights_for(s=s, E=E, p=p)

    def weights_for(self, *, s: np.ndarray, E: int, p: np.ndarray,
                    devices: Sequence[Hashable] | None = None) -> np.ndarray:
        with self.plugin.calling("arrival_weights"):
            got = self.impl.arrival_weights(s=s.copy(), E=E, p=p.copy())
        try:
            weights = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            raise self.plugin.error(f"returned {kind_of(got)} from arrival_weights; expected one number per "
                                    f"device, float64 [{len(s)}]") from None
        if weights.shape != s.shape:
            raise self.plugin.error(f"returned arrival weights of shape {list(weights.shape)} for {len(s)} devices; "
                                    f"expected [{len(s)}]")
        bad = np.flatnonzero(~np.isfinite(weights) | (weights < 0))
        if bad.size:
            k = int(bad[0])
            device = f"{devices[k]!r}" if devices is not None else k
            raise self.plugin.error(f"returned arrival weight {weights[k]:g} for device {device} (s = {int(s[k])}, "
                                    f"p = {float(p[k]):g}); a weight must be a finite number >= 0")
        return weights

    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        with self.plugin.calling("round_scale"):
            got = self.impl.round_scale(s=s.copy(), E=E, p=p.copy())
        if got is None:
            return None
        try:
            scale = float(got)
        except (TypeError, ValueError):
            raise self.plugin.error(f"returned {kind_of(got)} from round_scale; expected a number, or None to "
                                    "discard the round") from None
        if not (np.isfinite(scale) and scale >= 0):
            raise self.plugin.error(f"returned round scale {scale:g}; it must be a finite number >= 0 (or None)")
        return scale
