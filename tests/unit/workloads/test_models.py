"""The three models: shapes, parameter counts, and batching over devices with vmap."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, stack_module_state, vmap

from flexfl.errors import ConfigError
from workloads.models import EmnistCNN, LogisticRegression, MnistMLP, build_model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_mlp_has_fedavg_2nn_parameter_count() -> None:
    # 784*200+200 + 200*200+200 + 200*10+10
    assert n_params(MnistMLP()) == 199_210


def test_cnn_parameter_count_for_47_classes() -> None:
    # The paper's CNN layer by layer (weights + biases), so that a wrong layer is named, not only a wrong total.
    paper = {"conv1": 32 * 1 * 5 * 5 + 32, "conv2": 64 * 32 * 5 * 5 + 64, "fc1": 64 * 7 * 7 * 512 + 512,
             "fc2": 512 * 47 + 47}
    model = EmnistCNN(num_classes=47)
    assert {name: n_params(layer) for name, layer in model.named_children()} == paper
    assert n_params(model) == 1_682_351


def test_logreg_parameter_count() -> None:
    assert n_params(LogisticRegression(in_features=60, num_classes=10)) == 610


@pytest.mark.parametrize(
    ("model", "shapes", "out"),
    [
        (MnistMLP(), [(5, 784), (5, 1, 28, 28)], 10),
        (EmnistCNN(num_classes=47), [(5, 784), (5, 1, 28, 28)], 47),
        (LogisticRegression(in_features=60, num_classes=10), [(5, 60)], 10),
    ],
    ids=["mlp", "cnn", "logreg"],
)
def test_output_shapes_and_flat_vs_image_input_agree(model: torch.nn.Module, shapes: list, out: int) -> None:
    torch.manual_seed(0)
    x = torch.rand(shapes[0])
    results = [model(x.reshape(shape)) for shape in shapes]
    for logits in results:
        assert logits.shape == (5, out)
    assert torch.equal(results[0], results[-1])


@pytest.mark.parametrize(
    ("factory", "in_shape"),
    [
        (MnistMLP, (4, 784)),
        (lambda: EmnistCNN(num_classes=47), (4, 1, 28, 28)),
        (lambda: LogisticRegression(in_features=60, num_classes=10), (4, 60)),
    ],
    ids=["mlp", "cnn", "logreg"],
)
def test_vmap_over_stacked_device_parameters_matches_separate_calls(factory, in_shape: tuple) -> None:
    torch.manual_seed(1)
    models = [factory() for _ in range(3)]  # different random inits = 3 devices
    params, buffers = stack_module_state(models)
    base = factory().to("meta")
    x = torch.rand((3, *in_shape))  # one batch per device

    def call(p, b, xb):
        return functional_call(base, (p, b), (xb,))

    batched = vmap(call)(params, buffers, x)
    separate = torch.stack([m(xb) for m, xb in zip(models, x)])
    assert batched.shape == separate.shape
    torch.testing.assert_close(batched, separate, rtol=1e-5, atol=1e-5)
    # The parameter sets really differ, so agreement is not trivial.
    assert not torch.allclose(separate[0], separate[1])


def test_build_model_by_name() -> None:
    assert isinstance(build_model("mlp", num_classes=10), MnistMLP)
    cnn = build_model("cnn", num_classes=47)
    assert isinstance(cnn, EmnistCNN) and cnn.fc2.out_features == 47
    logreg = build_model("logreg", in_features=60, num_classes=10)
    assert isinstance(logreg, LogisticRegression) and logreg.linear.in_features == 60


def test_build_model_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="mlp, cnn, logreg"):
        build_model("resnet", num_classes=10)


def test_build_model_rejects_mlp_with_other_class_count() -> None:
    with pytest.raises(ConfigError, match="10 classes"):
        build_model("mlp", num_classes=47)


# ---------------------------------------------------------------- plug-ins

NET = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, in_features, num_classes):
            super().__init__()
            self.fc = nn.Linear(in_features, num_classes)

        def forward(self, x):
            return self.fc(x.flatten(1))

    def two_layers(num_classes):  # a function, taking only one of the sizes
        return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, num_classes))
"""


def test_a_plug_in_model_is_built_with_the_sizes_it_takes_and_trains(plugin_module) -> None:
    """Resolved where built-in names are, and used as the agent and the simulator use a model: local SGD."""
    import numpy as np

    from edge_agent.trainer import train_local
    from workloads.datasets import ArrayDataset

    name = plugin_module(NET)
    net = build_model(f"{name}:Net", in_features=12, num_classes=3, input_shape=(3, 4))
    assert type(net).__name__ == "Net" and net.fc.in_features == 12 and net.fc.out_features == 3
    seq = build_model(f"{name}:two_layers", in_features=12, num_classes=5, input_shape=(12,))
    assert seq[-1].out_features == 5
    rng = np.random.default_rng(0)
    data = ArrayDataset(x=rng.normal(size=(40, 3, 4)).astype(np.float32), y=rng.integers(0, 3, 40))
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    result = train_local(net, data, updates=3, lr=0.1, batch_size=8, rng=np.random.default_rng(1))
    assert result.updates_completed == 3 and set(result.delta) == set(before)
    assert any(float(d.abs().sum()) > 0 for d in result.delta.values())


@pytest.mark.parametrize(("source", "problem"), [
    ("from torch import nn\nclass Net(nn.Module):\n"
     "    def __init__(self, in_features, num_classes):\n        super().__init__()\n"
     "        self.fc = nn.Linear(in_features, 7)\n    def forward(self, x):\n        return self.fc(x)\n",
     "returned logits of shape [2, 7] for an input [2, 12]; expected [2, 3]: one logit per class (num_classes = 3)"),
    ("from torch import nn\nclass Net(nn.Module):\n"
     "    def __init__(self, in_features, num_classes):\n        super().__init__()\n"
     "        self.fc = nn.Linear(in_features, num_classes)\n        self.bn = nn.BatchNorm1d(num_classes)\n"
     "    def forward(self, x):\n        return self.bn(self.fc(x))\n",
     "has buffers (bn.running_mean, bn.running_var, bn.num_batches_tracked); FlexFL aggregates parameters only"),
    ("import torch\nfrom torch import nn\nclass Net(nn.Module):\n"
     "    def __init__(self, in_features, num_classes):\n        super().__init__()\n"
     "        self.fc = nn.Linear(in_features, num_classes).double()\n"
     "    def forward(self, x):\n        return self.fc(x.double())\n",
     "has parameter 'fc.weight' of dtype torch.float64; FlexFL trains and sends float32"),
    ("from torch import nn\nclass Net(nn.Module):\n"
     "    def __init__(self, in_features, num_classes):\n        super().__init__()\n"
     "        self.fc = nn.Linear(in_features, num_classes)\n"
     "    def forward(self, x):\n        return self.fc(x).detach()\n",
     "returned logits that do not depend on its parameters"),
    ("from torch import nn\nclass Net(nn.Module):\n"
     "    def __init__(self, in_features, num_classes):\n        super().__init__()\n"
     "        self.fc = nn.Linear(in_features, num_classes)\n"
     "    def forward(self, x):\n        return {'logits': self.fc(x)}\n",
     "returned a dict from forward; it should return logits, a tensor [batch, num_classes]"),
    ("class Net:\n    def __init__(self, in_features, num_classes):\n        pass\n",
     "returned a Net from Net(in_features=12, num_classes=3); it should be a torch.nn.Module class"),
    ("Net = 3\n", "is an int; it should be a torch.nn.Module class"),
    ("from torch import nn\nclass Net(nn.Module):\n    def __init__(self, num_classes):\n"
     "        super().__init__()\n        raise ValueError(f'no {num_classes}-class head yet')\n",
     "raised ValueError: no 3-class head yet in Net(num_classes=3) ({module}.py:5)"),
])
def test_a_wrong_plug_in_model_is_one_line_naming_it_and_what_is_wrong(plugin_module, source, problem) -> None:
    from flexfl.errors import PluginError

    name = plugin_module(source)
    with pytest.raises(PluginError) as exc:
        build_model(f"{name}:Net", in_features=12, num_classes=3, input_shape=(12,))
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"model plug-in '{name}:Net' {problem.format(module=name)}"), text


def test_an_exception_in_a_plug_in_forward_later_on_is_one_line_too(plugin_module) -> None:
    """The first call on zeros passes; a batch of real data makes the plug-in raise, inside training."""
    import numpy as np

    from edge_agent.trainer import train_local
    from flexfl.errors import PluginError
    from workloads.datasets import ArrayDataset
    from workloads.evaluation import evaluate

    name = plugin_module("""
        from torch import nn

        class Net(nn.Module):
            def __init__(self, in_features, num_classes):
                super().__init__()
                self.fc = nn.Linear(in_features, num_classes)

            def forward(self, x):
                if float(x.abs().sum()) > 0:
                    raise RuntimeError("my layer cannot take this batch")
                return self.fc(x)
    """)
    net = build_model(f"{name}:Net", in_features=4, num_classes=2, input_shape=(4,))
    data = ArrayDataset(x=np.ones((8, 4), np.float32), y=np.zeros(8, np.int64))
    expected = (f"model plug-in '{name}:Net' raised RuntimeError: my layer cannot take this batch in forward "
                f"({name}.py:11)")
    with pytest.raises(PluginError) as exc:
        train_local(net, data, updates=1, lr=0.1, batch_size=4, rng=np.random.default_rng(0))
    assert str(exc.value) == expected
    with pytest.raises(PluginError) as exc:
        evaluate(net, dict(net.named_parameters()), data)
    assert str(exc.value) == expected
