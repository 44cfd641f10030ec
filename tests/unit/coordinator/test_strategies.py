"""Plug-in strategies: resolved by get_strategy and [rules] strategy, used by both forms of the round, and every
fault of one (a missing method, a wrong result, an exception in it) is one line naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.rules.aggregation import RunningAggregate, apply_update, coefficients
from coordinator.rules.config import RulesConfig
from coordinator.rules.plugin_strategy import PluginStrategy
from coordinator.rules.strategies import get_strategy, title_of
from flexfl.errors import ConfigError, PluginError

SQRT = """
    import numpy as np
    from coordinator.rules.strategies import Strategy

    class SqrtRescale(Strategy):
        label = "sqrt-c"
        title = "Scheme C, square root"

        def arrival_weights(self, *, s, E, p):
            return p * np.sqrt(np.divide(E, s, out=np.zeros(len(s)), where=s > 0))

        def round_scale(self, *, s, E, p):
            return None if not (s > 0).any() else 1.0

    class Halved:  # duck-typed, no base class, an instance's own parameters
        parameters = {"factor": 0.5}

        def __init__(self):
            self.factor = 0.5

        def arrival_weights(self, *, s, E, p):
            return np.where(s > 0, self.factor * p, 0.0)

        def round_scale(self, *, s, E, p):
            return 2.0

    INSTANCE = Halved()
"""


def test_a_plug_in_strategy_gives_both_forms_of_the_round_its_factors(plugin_module) -> None:
    """The simulator's stacked update and the coordinator's running sum, from the plug-in's two factors."""
    name = plugin_module(SQRT)
    rule = get_strategy(f"{name}:SqrtRescale")
    assert isinstance(rule, PluginStrategy) and get_strategy(f"{name}:SqrtRescale") is rule  # resolved once
    assert (rule.name, rule.label, rule.title, rule.description) == (
        f"{name}:SqrtRescale", "sqrt-c", "Scheme C, square root", "Scheme C, square root")
    assert rule.new_memory(like={}) is None and rule.counts_per_update(steps_per_update=np.ones(2, np.int64),
                                                                       n_samples=np.ones(2, np.int64)) is None
    s, E, p = np.array([4, 1, 0, 2]), 4, np.array([0.1, 0.2, 0.3, 0.4])
    c = coefficients(rule, s=s, E=E, p=p)
    np.testing.assert_allclose(c.values, [0.1, 0.2 * 2, 0.0, 0.4 * np.sqrt(2)])
    assert coefficients(rule, s=np.zeros(4, np.int64), E=E, p=p).discarded  # its round_scale said None
    rng = np.random.default_rng(0)
    w = {"w": torch.randn(3, 2)}
    deltas = {"w": torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(1))}
    running = RunningAggregate(strategy=f"{name}:SqrtRescale", E=E, p=dict(enumerate(p.tolist())), like=w)
    for k in rng.permutation(4):
        running.add(int(k), s=int(s[k]), delta={"w": deltas["w"][k].numpy()})
    torch.testing.assert_close(running.apply(global_state=w)["w"],
                               apply_update(global_state=w, deltas=deltas, coefficients=c)["w"], rtol=1e-5, atol=1e-6)


def test_rules_name_a_plug_in_strategy_and_a_duck_typed_one_takes_its_own_settings(plugin_module) -> None:
    name = plugin_module(SQRT)
    rules = RulesConfig(strategy=f"{name}:SqrtRescale")
    assert rules.aggregation.label == "sqrt-c" and rules.with_strategy("C").aggregation.label == "C"
    for attr in ("Halved", "INSTANCE"):
        rule = RulesConfig(strategy=f"{name}:{attr}").aggregation
        assert (rule.label, rule.title, rule.parameters) == (attr.lower(), attr, {"factor": 0.5})
        assert rule.description == f"{attr} (factor = 0.5)"
    assert title_of("sqrt-c") == "sqrt-c"  # a run table's label of a plug-in: shown as it is


BROKEN = """
    import numpy as np
    from coordinator.rules.strategies import Strategy

    class NoScale(Strategy):
        def arrival_weights(self, *, s, E, p):
            return p

    class DuckWithoutScale:
        def arrival_weights(self, *, s, E, p):
            return p

    class Good:
        def arrival_weights(self, *, s, E, p):
            return p

        def round_scale(self, *, s, E, p):
            return 1.0

    class TooShort(Good):
        def arrival_weights(self, *, s, E, p):
            return p[:-1]

    class Negative(Good):
        def arrival_weights(self, *, s, E, p):
            return p - 0.15

    class Raises(Good):
        def round_scale(self, *, s, E, p):
            return {}[E]

    class WrongSignature(Good):
        def arrival_weights(self, s, E):
            return s

    class StringScale(Good):
        def round_scale(self, *, s, E, p):
            return "one"

    class TakenLabel(Good):
        label = "C"

    class OldMemoryFlag(Good):
        memory = True

    def scheme_d(s, E, p):
        return p
"""


@pytest.mark.parametrize(("attr", "problem"), [
    ("NoScale", "lacks round_scale (abstract in its base class)"),
    ("DuckWithoutScale", "lacks round_scale(*, s, E, p); it should be a class with arrival_weights"),
    ("TooShort", "returned arrival weights of shape [3] for 4 devices; expected [4]"),
    ("Negative", "returned arrival weight -0.05 for device 0 (s = 0, p = 0.1); a weight must be a finite number >= 0"),
    ("Raises", "raised KeyError: 4 in round_scale ({module}.py:30)"),
    ("WrongSignature", "raised TypeError: "),
    ("StringScale", "returned a str from round_scale; expected a number, or None to discard the round"),
    ("TakenLabel", "has label 'C', a built-in strategy's; give it a label of its own"),
    ("OldMemoryFlag", "sets memory = True, which FlexFL no longer reads: a strategy runs its own rule; give it "
                      "new_memory(*, like)"),
    ("scheme_d", "is a function; it should be a class with arrival_weights"),
])
def test_a_broken_plug_in_strategy_is_one_line_naming_it_before_any_round(plugin_module, attr, problem) -> None:
    """Probed on a small round when it is resolved, so a config naming it fails before a run starts."""
    name = plugin_module(BROKEN)
    with pytest.raises(PluginError) as exc:
        RulesConfig(strategy=f"{name}:{attr}")
    text = str(exc.value)
    assert "\n" not in text
    assert text.startswith(f"rules.strategy: strategy plug-in '{name}:{attr}' {problem.format(module=name)}"), text


def test_an_unknown_strategy_names_the_built_in_ones_and_the_plug_in_forms() -> None:
    with pytest.raises(ConfigError, match=r"unknown strategy 'fedfoo'; choose one of scheme-a, .*mifa, fedbuff "
                                          r"\(or a scheme: "
                                          r"A, B, C\), or a plug-in: MODULE:ATTRIBUTE"):
        get_strategy("fedfoo")
