"""A plug-in strategy's memory behind checks that name it (PluginStrategy.new_memory wraps every one in it).

A plug-in's new_memory(*, like) returns an object with close(round), snapshot() and
restore(state), and optionally keep_only(devices) and remembered (coordinator.rules.memory.StrategyMemory
says what each does; subclassing it is the simplest way). The model its close returns must
have the model's tensors, shaped alike and finite: a memory that breaks the model is the
plug-in's fault, said in one PluginError line, not a divergence blamed on the learning rate.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from coordinator.rules.memory import ClosingRound, StrategyMemory
from flexfl.plugins import Plugin, kind_of


class PluginMemory(StrategyMemory):
    """A plug-in strategy's StrategyMemory, each call checked and each exception in it one line naming the plug-in."""

    def __init__(self, plugin: Plugin, memory: Any, *, like: Mapping[str, torch.Tensor]) -> None:
        missing = [m for m in ("close", "snapshot", "restore") if not callable(getattr(memory, m, None))]
        if missing:
            raise plugin.error(f"returned {kind_of(memory)} from new_memory, which lacks {', '.join(missing)}; "
                               "expected a coordinator.rules.memory.StrategyMemory (or None: no memory)")
        self.plugin, self.impl = plugin, memory
        self.shapes = {name: tuple(w.shape) for name, w in like.items()}

    def close(self, round: ClosingRound) -> dict[str, torch.Tensor]:
        with self.plugin.calling("its memory's close"):
            got = self.impl.close(round)
        if not isinstance(got, Mapping) or set(got) != set(self.shapes):
            names = sorted(got) if isinstance(got, Mapping) else kind_of(got)
            raise self.plugin.error(f"returned {names} from its memory's close in round {round.round_index}; expected "
                                    f"the model's tensors {sorted(self.shapes)}")
        params = {}
        for name, value in got.items():
            t = torch.as_tensor(value)
            if tuple(t.shape) != self.shapes[name] or not t.is_floating_point() or not torch.isfinite(t).all():
                raise self.plugin.error(f"returned tensor '{name}' of shape {list(t.shape)} ({t.dtype}) from its "
                                        f"memory's close in round {round.round_index}; expected finite numbers of "
                                        f"shape {list(self.shapes[name])}")
            params[name] = t.detach().to(round.params[name].dtype)
        return params

    def keep_only(self, devices: set[str]) -> None:
        if callable(getattr(self.impl, "keep_only", None)):
            with self.plugin.calling("its memory's keep_only"):
                self.impl.keep_only(set(devices))

    @property
    def remembered(self) -> tuple[str, ...]:
        with self.plugin.calling("its memory's remembered"):
            return tuple(str(d) for d in getattr(self.impl, "remembered", ()))

    def snapshot(self) -> dict:
        with self.plugin.calling("its memory's snapshot"):
            state = self.impl.snapshot()
        if not isinstance(state, dict):
            raise self.plugin.error(f"returned {kind_of(state)} from its memory's snapshot; expected a dict")
        return copy.deepcopy(state)  # written by the checkpoint thread while the next round runs

    def restore(self, state: Mapping[str, Any]) -> None:
        with self.plugin.calling("its memory's restore"):
            self.impl.restore(copy.deepcopy(dict(state)))
