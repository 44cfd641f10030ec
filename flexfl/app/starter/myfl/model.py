"""A small model: FlexFL builds it with the dataset's sizes, trains it on every device and averages it.

FlexFL calls TinyNet(in_features=..., num_classes=...) (the keyword arguments it takes of
those two; `in_features` is one sample's size, flattened) and checks the module once on a
batch of zeros: parameters float32 and no buffers (batch norm's running statistics would not
be aggregated), logits [batch, num_classes]. Devices build it too: the coordinator sends them
this import path, and they need this package importable (README.md).
"""

from __future__ import annotations

import torch
from torch import nn


class TinyNet(nn.Module):
    """One hidden layer with ReLU: [batch, in_features] -> logits [batch, num_classes]."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 32) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_features, hidden)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x is a batch as the dataset shapes a sample ([batch, 16] here); softmax is in the loss.
        return self.out(torch.relu(self.hidden(x.flatten(1))))
