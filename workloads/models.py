"""The paper's three models: MNIST 2NN (MLP), EMNIST CNN, multinomial logistic regression.

All models return logits and are pure functions of (parameters, input): no batchnorm, no
dropout, no in-place ops, so `torch.func.functional_call` + `torch.func.vmap` can evaluate
many devices' parameter sets in one batched call.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from flexfl.errors import ConfigError

log = logging.getLogger(__name__)

MODEL_NAMES = ("mlp", "cnn", "logreg")


def _as_flat(x: torch.Tensor) -> torch.Tensor:
    # [B, 1, 28, 28] -> [B, 784]; [B, 784] passes through.
    return x.reshape(x.shape[0], -1)


def _as_image(x: torch.Tensor) -> torch.Tensor:
    # [B, 784] -> [B, 1, 28, 28]; [B, 1, 28, 28] passes through.
    return x.reshape(x.shape[0], 1, 28, 28)


class MnistMLP(nn.Module):
    """784-200-200-10 MLP with ReLU (FedAvg's "2NN"); 199,210 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 200)
        self.fc2 = nn.Linear(200, 200)
        self.fc3 = nn.Linear(200, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(_as_flat(x)))
        h = torch.relu(self.fc2(h))
        return self.fc3(h)


class EmnistCNN(nn.Module):
    """Two 5x5 conv layers (32, 64 channels) with 2x2 max-pool, FC 512, FC num_classes."""

    def __init__(self, num_classes: int = 47) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv1(_as_image(x))), 2)  # [B, 32, 14, 14]
        h = torch.max_pool2d(torch.relu(self.conv2(h)), 2)  # [B, 64, 7, 7]
        h = torch.relu(self.fc1(h.flatten(1)))  # [B, 512]
        return self.fc2(h)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one linear layer; softmax lives in the loss."""

    def __init__(self, in_features: int = 60, num_classes: int = 10) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(_as_flat(x))


def build_model(name: str, *, in_features: int | None = None, num_classes: int) -> nn.Module:
    """Build a model by name: "mlp", "cnn" or "logreg".

    `in_features` matters only for "logreg" (default 60); the MLP and CNN take 28x28 images.
    The MLP is fixed at 10 classes, as in the paper.
    """
    if name == "mlp":
        if num_classes != 10:
            raise ConfigError(f"model 'mlp' has 10 classes, got num_classes={num_classes}")
        if in_features not in (None, 784):
            raise ConfigError(f"model 'mlp' takes 784 features, got in_features={in_features}")
        return MnistMLP()
    if name == "cnn":
        if in_features not in (None, 784):
            raise ConfigError(f"model 'cnn' takes 28x28 images (784), got in_features={in_features}")
        return EmnistCNN(num_classes=num_classes)
    if name == "logreg":
        return LogisticRegression(in_features=in_features or 60, num_classes=num_classes)
    raise ConfigError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}")
