"""The simulator's test evaluation: the objective's test set each round, and the extra test sets beside it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from simulator.trainers.trainer_kind import cache_trainer_available
from workloads.datasets import ArrayDataset
from workloads.federated import FederatedData


def evaluate(model: torch.nn.Module, params: Mapping[str, torch.Tensor], data: ArrayDataset) -> tuple[float, float]:
    """Test accuracy and mean loss: on the cache trainer's kernels where numba imports, else through torch.

    The two agree to float32 rounding (tests/unit/simulator/test_cache_trainer.py); the kernels
    are imported here, not at the top, so that the simulator imports without the [sim] extra."""
    if cache_trainer_available():
        from simulator.trainers.cache_trainer import evaluate as kernel_evaluate

        return kernel_evaluate(model, dict(params), data)
    from workloads.evaluation import evaluate as torch_evaluate

    return torch_evaluate(model, dict(params), data)


def evaluate_round(model: torch.nn.Module, params: Mapping[str, torch.Tensor], data: FederatedData, *,
                   members: Sequence[int], extra: Mapping[str, Sequence[int]]
                   ) -> tuple[float, float, dict[str, dict[str, float]]]:
    """Accuracy and loss on the holdouts of `members` (shards), and on each extra test set's shards by name."""
    acc, loss = evaluate(model, params, data.test_for(list(members)))
    others = {name: dict(zip(("acc", "loss"), evaluate(model, params, data.test_for(list(shards)))))
              for name, shards in extra.items()}
    return acc, loss, others
