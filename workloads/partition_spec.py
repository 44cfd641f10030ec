"""The partition spec: the one description of how a dataset is split over devices.

Every config that involves data embeds it as a `[partition]` table (coordinator, simulator,
`flexfl live`, the trace recorder's profile); the coordinator sends it to each agent when
it joins, and an agent trains on shard `shard_index` of exactly this split or not at all.
Building the data from a spec is `workloads.federated` (`build_federated`, `load_shard`).
The dataset is a built-in one or a plug-in (workloads.datasets.dataset_plugin): an agent
receives the plug-in's name with the spec and must be able to import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from enum import StrEnum

from flexfl.config import coerce_enums, from_dict, to_dict
from flexfl.errors import ConfigError, PartitionMismatch
from flexfl.plugins import DATASET, Plugin, kind_of, plugin_forms, resolve
from flexfl.text import count


class Dataset(StrEnum):
    MNIST = "mnist"
    EMNIST = "emnist"
    SYNTHETIC = "synthetic"


def is_builtin_dataset(name: Dataset | str) -> bool:
    """`name` is one of FlexFL's datasets, not a plug-in's name."""
    return name in Dataset.__members__.values()


class Sizes(StrEnum):
    """How many samples each device holds. The paper says only "Type-I Pareto with index 0.5";
    these are the readings FlexFL offers (results/README.md compares them):

    - pareto: Pareto(0.5) draws (x_m = 1) in proportion, scaled to the total, `min` each;
      heavy-tailed: with 100 devices one device often holds most of the data. For
      non-IID images a label's devices are shrunk when they ask for more than it has.
    - pareto-capped: the same draws, no device above one class's share of the total
      (total / classes); the excess goes to the others in proportion.
    - pareto-truncated: Pareto(0.5) truncated to [1, N] (N devices), then scaled.
    - pareto-per-label: non-IID images only: the devices of a label share that label's
      samples in Pareto(0.5) proportions: one label per device, never shrunk.
    - lognormal: FedProx's floor(LogNormal(4, 2)) + 50, in proportion, scaled.
    - equal: the same count for every device (the paper's arrival/departure experiments).
    """

    PARETO = "pareto"
    PARETO_CAPPED = "pareto-capped"
    PARETO_TRUNCATED = "pareto-truncated"
    PARETO_PER_LABEL = "pareto-per-label"
    LOGNORMAL = "lognormal"
    EQUAL = "equal"


# Not part of the split's identity: where this machine keeps the data.
_LOCAL = {"path": True, "identity": False}


@dataclass(frozen=True, eq=False)  # equal = same identity(): see __eq__
class PartitionSpec:
    """Dataset, number of shards, IID or not, sample counts and seed: the split, reproducibly.

    alpha/beta shape SYNTHETIC only; left out they are 1.0 for non-IID (the paper's
    SYNTHETIC(1,1)) and 0.0 for IID, and giving them for another dataset, or for IID, is
    an error. Two specs are equal when they describe the same split (`identity`).
    total_samples left out is the dataset's default (all of MNIST/EMNIST, 20000 SYNTHETIC).
    holdout_fraction splits each device's samples into training and a holdout; the test set
    is then the holdouts of the objective's devices (an arrival's holdout joins it, an
    excluded device's leaves it). Left out: SYNTHETIC keeps FedProx's 10 %, MNIST/EMNIST
    use the dataset's own test set.
    emnist_root is where this machine keeps EMNIST (torchvision layout); each machine sets
    its own, so it is not sent to agents nor compared.
    A plug-in dataset (a name that is not built-in) is split like MNIST: IID or one label per
    device, sizes as `sizes` says, the plug-in's own test set (or holdouts).
    """

    dataset: Dataset | str = Dataset.SYNTHETIC  # or a plug-in's name: "mypkg.data:load", an entry point's
    n_devices: int = 10
    iid: bool = False
    alpha: float | None = None
    beta: float | None = None
    total_samples: int | None = None
    sizes: Sizes = Sizes.PARETO
    seed: int = 0
    holdout_fraction: float | None = None  # per-device holdout; None: SYNTHETIC 0.1 (FedProx), images 0
    emnist_root: str = field(default="", compare=False, metadata=_LOCAL)

    def __post_init__(self) -> None:
        coerce_enums(self)
        if not isinstance(self.dataset, Dataset):
            try:
                dataset_plugin(self.dataset)  # importable, and callable: its data is checked when loaded
            except ConfigError as exc:
                raise type(exc)(f"partition.dataset: {exc}") from None
        if self.n_devices < 1:
            raise ConfigError(f"partition.n_devices must be >= 1, got {self.n_devices}")
        if self.total_samples is not None and self.total_samples < self.n_devices:
            raise ConfigError(f"partition.total_samples ({self.total_samples}) must be at least "
                              f"n_devices ({self.n_devices})")
        if self.holdout_fraction is not None and not 0 <= self.holdout_fraction < 1:
            raise ConfigError(f"partition.holdout_fraction must be in [0, 1), got {self.holdout_fraction}")
        if self.sizes is Sizes.PARETO_PER_LABEL and (self.iid or self.dataset is Dataset.SYNTHETIC):
            raise ConfigError("partition.sizes = pareto-per-label shares each label among its devices: "
                              "it needs non-IID MNIST or EMNIST")
        if self.dataset is Dataset.SYNTHETIC and self.holdout == 0:
            raise ConfigError("partition.holdout_fraction = 0 leaves SYNTHETIC without a test set (its test set is the "
                              "devices' holdouts): give it a fraction in (0, 1), or leave it out for 0.1")
        if self.dataset is not Dataset.SYNTHETIC:
            if self.alpha is not None or self.beta is not None:
                raise ConfigError(f"partition.alpha/beta shape SYNTHETIC only; leave them out for {self.dataset}")
            return
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"partition.{name} is a standard deviation and must be >= 0, got {value}")
        if self.iid and (self.alpha or self.beta):
            raise ConfigError(f"partition.alpha/beta ({self.alpha}, {self.beta}) shape non-IID SYNTHETIC only; "
                              "set iid = false or leave them out")

    @property
    def holdout(self) -> float:
        """The per-device holdout fraction in use (defaults filled in)."""
        if self.holdout_fraction is not None:
            return self.holdout_fraction
        return 0.1 if self.dataset is Dataset.SYNTHETIC else 0.0

    @property
    def synthetic_alpha(self) -> float:
        """alpha as used (SYNTHETIC): as given, else 1.0 non-IID and 0.0 IID."""
        return self.alpha if self.alpha is not None else (0.0 if self.iid else 1.0)

    @property
    def synthetic_beta(self) -> float:
        return self.beta if self.beta is not None else (0.0 if self.iid else 1.0)

    def identity(self) -> dict:
        """The fields that define the split (what agents must match), as plain values, defaults filled in."""
        local = {f.name for f in fields(self) if not f.metadata.get("identity", True)}
        out = {k: v for k, v in to_dict(self).items() if k not in local}
        if self.dataset is Dataset.SYNTHETIC:
            out.update(alpha=self.synthetic_alpha, beta=self.synthetic_beta)
        out["holdout_fraction"] = self.holdout
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionSpec) and self.identity() == other.identity()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def to_json(self) -> str:
        """The identity as canonical JSON: what the coordinator sends at join."""
        return json.dumps(self.identity(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, where: str, ours: PartitionSpec | None = None) -> PartitionSpec:
        """The spec in `text`. With `ours` (the coordinator's, checking a device's), a plug-in dataset other than
        ours is a PartitionMismatch before its name is resolved: a plug-in a device names is never imported here."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: partition is not valid JSON: {exc}") from None
        claimed = raw.get("dataset") if isinstance(raw, dict) else None
        if (ours is not None and isinstance(claimed, str) and claimed != ours.dataset
                and not is_builtin_dataset(claimed)):
            raise PartitionMismatch(f"{where}: its partition's dataset is {raw.get('dataset')!r}, the coordinator's "
                                    f"{str(ours.dataset)!r}")
        return from_dict(cls, raw, where=where, table="partition")

    def differences(self, other: PartitionSpec) -> list[str]:
        """'key: mine vs theirs' for every identity field that differs."""
        a, b = self.identity(), other.identity()
        return [f"{k}: {a.get(k)} vs {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]

    def describe(self) -> str:
        """One line for logs and errors: 'synthetic(1,1) non-IID, 10 devices, pareto sizes, seed 0'."""
        name = str(self.dataset)
        if self.dataset is Dataset.SYNTHETIC:
            name += f"({self.synthetic_alpha:g},{self.synthetic_beta:g})"
        total = f", {self.total_samples} samples" if self.total_samples is not None else ""
        return (f"{name} {'IID' if self.iid else 'non-IID'}, {count(self.n_devices, 'device')}{total}, "
                f"{self.sizes} sizes, seed {self.seed}")


def device_id(shard: int) -> str:
    """The id of the device that holds shard `shard`: dev-<shard>. A simulation, `flexfl live`'s
    agents, the emulated fleet and imported timelines all name their devices so, which is what lets
    one run's devices be matched with another's (a timeline's rows, a live run beside its simulation)."""
    return f"dev-{shard}"


def dataset_plugin(name: str) -> Plugin:
    """The plug-in a dataset name that is not built-in leads to, checked to be callable (a ConfigError if none)."""
    plugin = resolve(DATASET, name)
    if plugin is None:
        raise ConfigError(f"expected one of {', '.join(d.value for d in Dataset)}, got {name!r}; "
                          f"{plugin_forms(DATASET)}")
    if not callable(plugin.obj):
        raise plugin.error(f"is {kind_of(plugin.obj)}; it should be {DATASET.expects}")
    return plugin
