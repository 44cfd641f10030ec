"""The paper's three models (MNIST 2NN (MLP), EMNIST CNN, multinomial logistic regression), and plug-ins.

All models return logits and are pure functions of (parameters, input): no batchnorm, no
dropout, no in-place ops, so `torch.func.functional_call` + `torch.func.vmap` can evaluate
many devices' parameter sets in one batched call.

`build_model` is the one place that maps a model's name to a module: a built-in name, or a
plug-in (flexfl.plugins: "mypkg.models:TinyNet" or an entry point of `flexfl.models`). A
plug-in is a class or function called with `in_features` and `num_classes` (those of its
keyword arguments it takes); it must return float32 parameters only (no buffers: FlexFL
aggregates parameters, and batch norm's running statistics would stay each device's own)
and logits [batch, num_classes]. Exceptions raised in its code become one PluginError line.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flexfl.errors import ConfigError
from flexfl.plugins import MODEL, Plugin, kind_of, plugin_forms, resolve

log = logging.getLogger(__name__)

MODEL_NAMES = ("mlp", "cnn", "logreg")
PROBE_BATCH = 2  # samples in the batch of zeros a plug-in model is first run on


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


@dataclass(frozen=True)
class ModelSpec:
    """A model to build: its name (built-in or plug-in) and its data's sample shape and number of classes."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int

    @property
    def in_features(self) -> int:
        return int(np.prod(self.input_shape))

    def build(self) -> nn.Module:
        """The model (a plug-in run once on a batch of zeros of the data's shape: see build_model)."""
        return build_model(self.name, in_features=self.in_features, num_classes=self.num_classes,
                           input_shape=self.input_shape)


def build_model(name: str, *, in_features: int | None = None, num_classes: int,
                input_shape: tuple[int, ...] | None = None) -> nn.Module:
    """Build a model by name: "mlp", "cnn", "logreg", or a plug-in's (module docstring).

    `in_features` matters only for "logreg" (default 60) and plug-ins; the MLP and CNN take
    28x28 images. The MLP is fixed at 10 classes, as in the paper. With `input_shape` (one
    sample's), a plug-in model is run once on a batch of zeros of that shape and its output
    checked before anything trains.
    """
    if name not in MODEL_NAMES:
        return _build_plugin(model_plugin(name), in_features=in_features, num_classes=num_classes,
                             input_shape=input_shape)
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
    return LogisticRegression(in_features=in_features or 60, num_classes=num_classes)


def model_plugin(name: str) -> Plugin:
    """The plug-in a model name that is not built-in leads to, checked to be callable (a ConfigError if none)."""
    plugin = resolve(MODEL, name)
    if plugin is None:
        raise ConfigError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}, {plugin_forms(MODEL)}")
    if not callable(plugin.obj):
        raise plugin.error(f"is {kind_of(plugin.obj)}; it should be {MODEL.expects}")
    return plugin


def _build_plugin(plugin: Plugin, *, in_features: int | None, num_classes: int,
                  input_shape: tuple[int, ...] | None) -> nn.Module:
    sizes = {"in_features": in_features, "num_classes": num_classes}
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(plugin.obj).parameters
    except (TypeError, ValueError):  # a callable without a signature: give it everything
        params = {}
    takes_all = not params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in sizes.items() if v is not None and (takes_all or k in params)}
    call = f"{plugin.short_name}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
    with plugin.calling(call):
        model = plugin.obj(**kwargs)
    if not isinstance(model, nn.Module):
        raise plugin.error(f"returned {kind_of(model)} from {call}; it should be {MODEL.expects}")
    named = list(model.named_parameters())
    if not named:
        raise plugin.error("has no parameters: there is nothing to train")
    wrong = next(((n, p.dtype) for n, p in named if p.dtype != torch.float32), None)
    if wrong is not None:
        raise plugin.error(f"has parameter {wrong[0]!r} of dtype {wrong[1]}; FlexFL trains and sends float32 "
                           "(build it with float32 layers, or call .float())")
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        raise plugin.error(f"has buffers ({', '.join(buffers[:3])}); FlexFL aggregates parameters only, so state "
                           "such as batch norm's running statistics would differ on every device: use layers "
                           "without buffers (e.g. LayerNorm or GroupNorm instead of BatchNorm)")
    if input_shape is not None:
        _probe(plugin, model, input_shape=input_shape, num_classes=num_classes)
    _guard_forward(plugin, model)
    return model


def _probe(plugin: Plugin, model: nn.Module, *, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Run the model once on zeros [PROBE_BATCH, *input_shape]: logits [PROBE_BATCH, num_classes], with gradients."""
    x = torch.zeros((PROBE_BATCH, *input_shape))
    shape = f"[{', '.join(map(str, x.shape))}]"
    with plugin.calling(f"forward on a batch of zeros {shape}"), torch.enable_grad():  # whatever the caller's mode
        out = model(x)
    if not isinstance(out, torch.Tensor):
        raise plugin.error(f"returned {kind_of(out)} from forward; it should return logits, a tensor "
                           f"[batch, num_classes]")
    if tuple(out.shape) != (PROBE_BATCH, num_classes):
        raise plugin.error(f"returned logits of shape {list(out.shape)} for an input {shape}; expected "
                           f"[{PROBE_BATCH}, {num_classes}]: one logit per class (num_classes = {num_classes})")
    if not out.dtype.is_floating_point:
        raise plugin.error(f"returned logits of dtype {out.dtype}; expected float32")
    if not out.requires_grad:
        raise plugin.error("returned logits that do not depend on its parameters (no gradient to train with)")


def _guard_forward(plugin: Plugin, model: nn.Module) -> None:
    """Make an exception raised in the plug-in's forward one PluginError line naming it, wherever it is called.

    The trainers (the agent's and the simulator's) and the evaluation all call the module, so
    the instance's forward is wrapped once here rather than at every call site.
    """
    forward = model.forward

    def guarded(*args, **kwargs):
        with plugin.calling("forward"):
            return forward(*args, **kwargs)

    model.forward = guarded  # an instance attribute: found before the class's forward
