"""A strategy: how much each device's update counts when a round closes.

A FlexFL round updates the global model w <- w + sum_k c_k delta_k, and a strategy gives c_k
as two factors (coordinator/rules/strategies.py): arrival_weights, known when device k's update
arrives (from its s_k, the local steps it completed of the E asked, and its weight p_k in
the objective), and round_scale, known when the round closes. The paper's Scheme C weighs an
incomplete update (0 < s_k < E) by p_k E / s_k and Scheme B by p_k; this one takes the
middle road, p_k sqrt(E / s_k).
"""

from __future__ import annotations

import numpy as np

from coordinator.rules.strategy import Strategy


class SqrtRescale(Strategy):
    """Scheme C with a square-root rescaling of incomplete work."""

    label = "sqrt-c"  # names its runs' folders and table rows (`flexfl sim run` writes out/sim/sqrt-c/)
    title = "Scheme C, square-root rescaling"  # how printed lines and plots name it

    def arrival_weights(self, *, s: np.ndarray, E: int, p: np.ndarray) -> np.ndarray:
        """p_k sqrt(E / s_k) per device, 0 where s_k = 0 (it sent nothing); s int64 [N], p float64 [N]."""
        ratio = np.divide(E, s, out=np.zeros(len(s)), where=s > 0)
        return p * np.sqrt(ratio)

    def round_scale(self, *, s: np.ndarray, E: int, p: np.ndarray) -> float | None:
        """A factor on the whole round's sum, known at its close (None: discard the round); none here."""
        return 1.0
