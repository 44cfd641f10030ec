"""What one local update is; light (no torch), so that command-line parsers can name it."""

from __future__ import annotations

from enum import StrEnum


class Unit(StrEnum):
    """What one local update is: one minibatch SGD step (the paper's eq. (1)) or one epoch, ceil(n_k / B) steps."""

    STEP = "step"
    EPOCH = "epoch"
