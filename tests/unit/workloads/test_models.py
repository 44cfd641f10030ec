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
    conv1 = 32 * 1 * 5 * 5 + 32  # 832
    conv2 = 64 * 32 * 5 * 5 + 64  # 51,264
    fc1 = 64 * 7 * 7 * 512 + 512  # 1,606,144
    fc2 = 512 * 47 + 47  # 24,111
    assert conv1 + conv2 + fc1 + fc2 == 1_682_351
    assert n_params(EmnistCNN(num_classes=47)) == 1_682_351


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
