"""The paper's model and hyper-parameters per dataset; light (no torch), so that command-line help can quote them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadDefaults:
    """The paper's model and hyper-parameters for one dataset."""

    model: str
    eta0: float
    batch_size: int
    num_classes: int
    in_features: int


# Section 5.1 of the paper: eta_0 and batch sizes; models from FedAvg / FedProx.
DEFAULTS: dict[str, WorkloadDefaults] = {
    "mnist": WorkloadDefaults(model="mlp", eta0=2e-3, batch_size=10, num_classes=10, in_features=784),
    "emnist": WorkloadDefaults(model="cnn", eta0=5e-4, batch_size=10, num_classes=47, in_features=784),
    "synthetic": WorkloadDefaults(model="logreg", eta0=1.0, batch_size=20, num_classes=10, in_features=60),
}
