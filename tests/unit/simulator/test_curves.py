"""Recovery and crossing on hand-made curves."""

import math

from simulator.paper.curves import rounds_to_recover, rounds_until_cross


def _curve(start: int, values: list[float]) -> dict[int, float]:
    return {start + i: v for i, v in enumerate(values)}


def test_accuracy_recovery_counts_rounds_trained_with_the_newcomer():
    # The newcomer arrived during round 9 and trains from round 10; baseline 0.80 (round 9's level).
    acc = _curve(8, [0.79, 0.80, 0.62, 0.70, 0.78, 0.81, 0.83])
    r = rounds_to_recover(acc, first_round=10, baseline=0.80, higher_is_better=True)
    assert (r.rounds, r.horizon) == (4, 5)  # round 13 is the 4th round it trained in
    assert rounds_to_recover(acc, first_round=10, baseline=0.60, higher_is_better=True).rounds == 1
    never = rounds_to_recover(acc, first_round=10, baseline=0.90, higher_is_better=True)
    assert never.rounds is None and never.horizon == 5


def test_loss_recovery_goes_down_to_the_baseline_and_skips_nan():
    loss = _curve(10, [2.0, math.nan, 0.9, 0.5])
    assert rounds_to_recover(loss, first_round=10, baseline=0.95, higher_is_better=False).rounds == 3
    assert rounds_to_recover(loss, first_round=10, baseline=0.1, higher_is_better=False).rounds is None


def test_crossing_of_include_and_exclude_losses():
    include = _curve(1, [3.0, 2.0, 1.00, 0.90, 0.85, 0.82, 0.80, 0.79])
    exclude = _curve(1, [3.0, 2.0, 1.00, 1.40, 1.00, 0.84, 0.78, 0.70])  # departure after round 3
    c = rounds_until_cross(include, exclude, departure_round=3)
    assert (c.rounds, c.excluded_worse_at_first, c.horizon) == (4, True, 5)  # round 7: 0.78 <= 0.80
    assert rounds_until_cross(include, _curve(1, [3, 2, 1, 0.5, 0.4]), departure_round=3).rounds == 1
    never = rounds_until_cross(include, _curve(1, [3, 2, 1, 5, 5, 5, 5, 5]), departure_round=3)
    assert never.rounds is None and never.excluded_worse_at_first
