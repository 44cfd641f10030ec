"""One simulated federated training run: traces -> s per device -> local SGD -> scheme -> metrics.

The learning rules come from their owners: coefficients and the update from
coordinator.aggregation, the objective and learning rate from coordinator.participation,
local SGD from edge_agent.trainer (or its batched equivalent in simulator.batched).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from coordinator.aggregation import Scheme, apply_update, coefficients, stack_deltas
from coordinator.participation import LearningRate, Objective
from edge_agent.trainer import device_rng, train_local
from flexfl.errors import ConfigError
from simulator.batched import BatchedTrainer
from workloads.evaluation import evaluate
from simulator.participation import FixedParticipation, TraceParticipation
from trace_recorder.format import TraceSet, read_trace_set
from workloads.federated import DEFAULTS, FederatedData, build_federated
from workloads.models import build_model

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE_SET = REPO_ROOT / "traces" / "paper"


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a simulation run (with the seed, it determines it exactly)."""

    dataset: str = "synthetic"
    iid: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    n_devices: int = 50
    rounds: int = 200
    E: int = 20
    scheme: str = "C"
    trace_set: str = str(DEFAULT_TRACE_SET)
    num_traces: int = 8
    sampling: str = "iid"
    s_rule: str = "round"
    seed: int = 0
    eta0: float | None = None  # None: the paper's value for the dataset
    batch_size: int | None = None  # None: the paper's value for the dataset
    unit: str = "step"
    # "batched" (vmap over devices), "plain" (edge_agent.trainer per device), or "auto":
    # batched for logistic regression (50 devices step together ~5x faster than one by one),
    # plain for the MLP/CNN, whose per-device weights make the batched step memory-bound
    # (equal speed alone, slower on a busy machine; see results/README.md).
    trainer: str = "auto"
    total_samples: int | None = None
    sizes: str = "pareto"  # sample counts: pareto (paper default) or equal
    emnist_root: str | None = None

    def resolved(self) -> SimConfig:
        """Fill dataset defaults and validate."""
        if self.dataset not in DEFAULTS:
            raise ConfigError(f"unknown dataset {self.dataset!r}; choose one of {sorted(DEFAULTS)}")
        d = DEFAULTS[self.dataset]
        cfg = replace(
            self,
            trainer=("batched" if d.model == "logreg" else "plain") if self.trainer == "auto" else self.trainer,
            eta0=d.eta0 if self.eta0 is None else self.eta0,
            batch_size=d.batch_size if self.batch_size is None else self.batch_size,
            scheme=Scheme(self.scheme).value,
        )
        if cfg.rounds < 1 or cfg.E < 1 or cfg.n_devices < 1:
            raise ConfigError(f"rounds, E and devices must be >= 1 (got {cfg.rounds}, {cfg.E}, {cfg.n_devices})")
        if cfg.trainer not in ("batched", "plain"):
            raise ConfigError(f"unknown trainer {cfg.trainer!r}; use 'batched' or 'plain'")
        if cfg.unit == "epoch" and cfg.trainer == "batched":
            raise ConfigError("the batched trainer counts updates as SGD steps; use --trainer plain with --unit epoch")
        return cfg

    def data_key(self) -> tuple:
        """Runs with equal data keys can share one FederatedData."""
        return (self.dataset, self.iid, self.alpha, self.beta, self.n_devices, self.seed, self.total_samples,
                self.sizes, self.emnist_root)


@dataclass(frozen=True)
class RoundRecord:
    round: int
    lr: float
    active: int  # devices with s > 0
    complete: int  # devices with s = E
    mean_s: float
    coef_sum: float
    discarded: bool
    train_loss: float  # coefficient-weighted mean local loss of contributors (nan if none)
    test_acc: float
    test_loss: float
    seconds: float


@dataclass
class SimResult:
    config: SimConfig
    records: list[RoundRecord] = field(default_factory=list)
    trace_assignment: list[str] = field(default_factory=list)
    device_updates: int = 0  # local SGD steps actually computed, over all devices and rounds
    wall_s: float = 0.0
    final_params: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        return self.records[-1].test_acc


def load_data(cfg: SimConfig) -> FederatedData:
    return build_federated(
        cfg.dataset,
        n_devices=cfg.n_devices,
        iid=cfg.iid,
        seed=cfg.seed,
        # alpha/beta only shape SYNTHETIC; other datasets would warn about them.
        alpha=cfg.alpha if cfg.dataset == "synthetic" else 0.0,
        beta=cfg.beta if cfg.dataset == "synthetic" else 0.0,
        total_samples=cfg.total_samples,
        sizes=cfg.sizes,
        emnist_root=Path(cfg.emnist_root) if cfg.emnist_root else None,
    )


def initial_model(cfg: SimConfig) -> torch.nn.Module:
    """The model every scheme starts from for this seed."""
    d = DEFAULTS[cfg.dataset]
    torch.manual_seed(cfg.seed)
    return build_model(d.model, in_features=d.in_features, num_classes=d.num_classes)


def run_simulation(
    config: SimConfig,
    *,
    data: FederatedData | None = None,
    traces: TraceSet | None = None,
    participation: TraceParticipation | FixedParticipation | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> SimResult:
    """Run `config.rounds` rounds and return per-round metrics and the final model.

    `participation` overrides the trace-driven s draws (e.g. FixedParticipation).
    """
    cfg = config.resolved()
    started = time.perf_counter()
    data = data if data is not None else load_data(cfg)
    if len(data.train) != cfg.n_devices:
        raise ConfigError(f"data has {len(data.train)} devices, config asks for {cfg.n_devices}")
    if participation is None:
        traces = traces if traces is not None else read_trace_set(Path(cfg.trace_set))
        participation = TraceParticipation(
            traces.first(cfg.num_traces), n_devices=cfg.n_devices, E=cfg.E, seed=cfg.seed,
            sampling=cfg.sampling, s_rule=cfg.s_rule,
        )
    model = initial_model(cfg)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    objective = Objective()
    ids = [str(k) for k in range(cfg.n_devices)]
    for k, n in zip(ids, data.sample_counts):
        objective.add_initial(k, int(n))
    schedule = LearningRate(cfg.eta0)
    batched = BatchedTrainer(model, data.train, batch_size=cfg.batch_size) if cfg.trainer == "batched" else None
    result = SimResult(config=cfg, trace_assignment=participation.trace_names)

    for tau in range(1, cfg.rounds + 1):
        t0 = time.perf_counter()
        s = participation.draw(tau)
        p = objective.weights(ids, round_index=tau)
        coef = coefficients(cfg.scheme, s=s, E=cfg.E, p=p)
        lr = schedule.at(round_index=tau, shift_round=objective.shift_round)
        # Only devices whose coefficient is non-zero change the aggregate: train just those.
        rows = coef.contributors
        losses = np.array([])
        if len(rows) and not coef.discarded:
            rngs = [device_rng(cfg.seed, tau, int(k)) for k in rows]
            if batched is not None:
                deltas, losses = batched.train(params, devices=rows, steps=s[rows], lr=lr, rngs=rngs)
            else:
                deltas, losses = _train_plain(model, params, data, rows, s, lr, rngs, cfg)
            params = apply_update(global_state=params, deltas=deltas, coefficients=coef, rows=rows)
            result.device_updates += int(s[rows].sum())
        acc, loss = evaluate(model, params, data.test)
        if not math.isfinite(loss):
            raise ConfigError(f"round {tau}: test loss became {loss}; the learning rate {lr:g} is too high for this setup")
        w = coef.values[rows]
        record = RoundRecord(
            round=tau, lr=lr, active=int((s > 0).sum()), complete=int((s == cfg.E).sum()),
            mean_s=float(s.mean()), coef_sum=float(coef.values.sum()), discarded=coef.discarded,
            train_loss=float(np.dot(w, losses) / w.sum()) if len(losses) and w.sum() > 0 else float("nan"),
            test_acc=acc, test_loss=loss, seconds=time.perf_counter() - t0,
        )
        result.records.append(record)
        if on_round is not None:
            on_round(record)
    result.final_params = params
    result.wall_s = time.perf_counter() - started
    return result


def _train_plain(model, params, data, rows, s, lr, rngs, cfg):
    """Per-device edge_agent.trainer.train_local: the reference the batched trainer must equal."""
    deltas, losses = [], []
    for k, rng in zip(rows, rngs):
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(params[n])
        res = train_local(model, data.train[k], updates=int(s[k]), lr=lr, batch_size=cfg.batch_size, rng=rng, unit=cfg.unit)
        deltas.append(res.delta)
        losses.append(res.mean_loss)
    return stack_deltas(deltas), np.array(losses)


def records_as_rows(result: SimResult) -> list[dict]:
    """Per-round rows for CSV output, each with the run's identifying config fields."""
    c = result.config
    ident = {
        "dataset": c.dataset, "iid": int(c.iid), "alpha": c.alpha, "beta": c.beta,
        "num_traces": c.num_traces, "scheme": c.scheme, "seed": c.seed,
    }
    return [{**ident, **asdict(r)} for r in result.records]
