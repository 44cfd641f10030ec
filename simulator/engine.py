"""One simulated federated run: traces -> s per device -> local SGD -> the shared round -> metrics.

The round itself (participants, learning rate, coefficients, update, arrivals and
departures) is coordinator.round.Federation, the same object the live coordinator runs.
This module adds what only a simulation has: s drawn from traces (trace_recorder.sampler,
the function live agents use), a schedule of arrivals and departures, local training of
many devices in one process (simulator.fast_trainer, or edge_agent.trainer per device), and
evaluation on the objective's test set (workloads.federated.FederatedData.test_for).

A run is a pure function of its config: data, initial model, trace assignment, s draws
and minibatches are seeded per (seed, device, round), so runs that differ only in a policy
(scheme, fast-reboot, departure policy) are paired. `run_paired` runs such configs in
lock-step and trains the rows of all of them in one row-trainer call per round (cache or fast).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import numpy as np
import torch

from coordinator.aggregation import stack_deltas
from coordinator.metrics import round_row
from coordinator.objective import DeparturePolicy
from coordinator.round import Arrival, Departure, Federation, RoundOpening, RulesConfig, Weighing
from edge_agent.trainer import device_rng, steps_per_update, train_local
from flexfl.config import coerce_enums, path_field, plugin_path_field
from flexfl.errors import ConfigError, DivergenceError
from simulator.fast_trainer import FastTrainer
from simulator.trainer_kind import TrainerKind
from trace_recorder import PAPER_TRACE_SET
from trace_recorder.format import TraceSet, read_trace_set
from trace_recorder.sampler import TraceSampler, assign_traces
from workloads.federated import FederatedData, build_federated, initial_model, model_spec
from workloads.partition_spec import PartitionSpec, device_id

log = logging.getLogger(__name__)

DEFAULT_TRACE_SET = PAPER_TRACE_SET


class ExtraTest(StrEnum):
    """Test sets evaluated every round beside the objective's (rows' "extra_tests").

    start: the holdouts of the devices present at round 0 (an arrival's paper baseline on
    the old test set); active: the holdouts of the devices that still train (an included
    departed device's data left out).
    """

    START = "start"
    ACTIVE = "active"


@dataclass(frozen=True)
class TracesConfig:
    """[traces]: devices follow traces drawn from the first `num_traces` of `set` (|T|)."""

    set: str = path_field(str(DEFAULT_TRACE_SET))
    num_traces: int = 8


@dataclass(frozen=True)
class ArrivalEvent:
    """Device `device` (its shard index) is absent until it arrives in round `round`.

    It joins the objective at the close of that round (the test set gains its holdout from
    that round's evaluation) and trains from the next round on, with fast-reboot.
    """

    device: int
    round: int


@dataclass(frozen=True)
class DepartureEvent:
    """Device `device` trains in round `round` and leaves at its close, under `policy` (default: rules')."""

    device: int
    round: int
    policy: DeparturePolicy | None = None


@dataclass(frozen=True)
class ScheduleConfig:
    """[schedule]: arrivals and departures ([[schedule.arrivals]] device = 3, round = 30)."""

    arrivals: tuple[ArrivalEvent, ...] = ()
    departures: tuple[DepartureEvent, ...] = ()

    def __post_init__(self) -> None:
        for d in self.departures:
            coerce_enums(d)

    def check(self, n_devices: int, rounds: int) -> None:
        seen: set[int] = set()
        for kind, events in (("arrival", self.arrivals), ("departure", self.departures)):
            for e in events:
                if not 0 <= e.device < n_devices:
                    raise ConfigError(f"schedule: {kind} of device {e.device}, outside 0..{n_devices - 1}")
                if not 1 <= e.round <= rounds:
                    raise ConfigError(f"schedule: {kind} of device {e.device} at round {e.round}, outside 1..{rounds}")
        for e in self.arrivals:
            if e.device in seen:
                raise ConfigError(f"schedule: device {e.device} arrives twice")
            seen.add(e.device)
        left: set[int] = set()
        for e in self.departures:
            if e.device in left:
                raise ConfigError(f"schedule: device {e.device} departs twice")
            left.add(e.device)
            arrival = next((a.round for a in self.arrivals if a.device == e.device), 0)
            if e.round <= arrival:
                raise ConfigError(f"schedule: device {e.device} departs at round {e.round}, not after its arrival "
                                  f"at round {arrival}")


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a simulation run (with the seed, it determines it exactly)."""

    partition: PartitionSpec = field(default_factory=lambda: PartitionSpec(n_devices=50))
    rules: RulesConfig = field(default_factory=RulesConfig)
    traces: TracesConfig = field(default_factory=TracesConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    rounds: int = 200
    seed: int = 0  # initial model, trace assignment, s draws, minibatches (the partition has its own)
    trainer: TrainerKind = TrainerKind.AUTO
    extra_tests: tuple[ExtraTest, ...] = ()
    plugin_path: str | None = plugin_path_field()  # a folder put on sys.path for the plug-ins named here

    def __post_init__(self) -> None:
        coerce_enums(self)
        object.__setattr__(self, "extra_tests", tuple(ExtraTest(t) for t in self.extra_tests))
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")
        self.rules.check_for(self.partition.dataset)
        if self.rules.plugin_model and self.trainer in ROW_TRAINERS:
            raise ConfigError(f"trainer = {self.trainer.value!r} has kernels for the built-in models only; the plug-in "
                              f"model {self.rules.model!r} trains with trainer = 'plain' (or 'auto', which picks it)")
        if self.traces.num_traces < 1:
            raise ConfigError(f"traces.num_traces must be >= 1, got {self.traces.num_traces}")
        self.schedule.check(self.partition.n_devices, self.rounds)

    def in_effect(self) -> SimConfig:
        """This config with the rules' constants of departure policies its departures never use
        at a fixed value (RulesConfig.in_effect): equal for configs that run alike."""
        used = {d.policy or self.rules.departure_policy for d in self.schedule.departures}
        return replace(self, rules=self.rules.in_effect(used))

    @property
    def trainer_kind(self) -> TrainerKind:
        if self.trainer is not TrainerKind.AUTO:
            return self.trainer
        if self.rules.plugin_model:
            return TrainerKind.PLAIN  # the row trainers' kernels are the built-in models'
        return TrainerKind.CACHE if cache_trainer_available() else TrainerKind.FAST

    @property
    def batched(self) -> bool:
        """Trained by a row trainer (cache or fast), which paired runs share; not the plain per-device loop."""
        return self.trainer_kind in ROW_TRAINERS


def _cache_trainer(*args, **kwargs):
    try:
        from simulator.cache_trainer import CacheTrainer  # needs numba (the [sim] extra)
    except ImportError as exc:
        raise ConfigError(f"trainer = 'cache' needs numba (pip install 'flexfl[sim]'): {exc}; "
                          "trainer = 'fast' or 'auto' simulates without it") from None

    return CacheTrainer(*args, **kwargs)


ROW_TRAINERS = {TrainerKind.CACHE: _cache_trainer, TrainerKind.FAST: FastTrainer}


@functools.cache
def cache_trainer_available() -> bool:
    """numba imports (pip install 'flexfl[sim]'); else auto picks the batched torch trainer, and says so.

    An import, not importlib.util.find_spec: a numba that is found but does not load (an llvmlite
    of another build) must fall back too."""
    try:
        import numba  # noqa: F401
    except ImportError as exc:
        log.warning("numba is not installed (pip install 'flexfl[sim]'): simulating on the batched torch trainer, "
                    "about half the cache trainer's speed on MNIST (%s)", exc)
        return False
    return True


def evaluate(model: torch.nn.Module, params: Mapping[str, torch.Tensor], data) -> tuple[float, float]:
    """Test accuracy and mean loss: on the cache trainer's kernels where numba imports, else through torch.

    The two agree to float32 rounding (tests/unit/simulator/test_cache_trainer.py); the kernels
    are imported here, not at the top, so that the engine imports without the [sim] extra."""
    if cache_trainer_available():
        from simulator.cache_trainer import evaluate as kernel_evaluate

        return kernel_evaluate(model, dict(params), data)
    from workloads.evaluation import evaluate as torch_evaluate

    return torch_evaluate(model, dict(params), data)


@dataclass(frozen=True)
class RoundRecord:
    round: int
    lr: float
    active: int  # devices with s > 0
    complete: int  # devices with s = E
    mean_s: float  # over the round's participants
    coef_sum: float
    discarded: bool
    train_loss: float  # coefficient-weighted mean local loss of contributors (nan if none)
    test_acc: float
    test_loss: float
    seconds: float
    members: int  # devices in the objective after the round
    events: str  # "+dev-3 -dev-0(exclude)" for arrivals/departures applied at its close


@dataclass
class SimResult:
    config: SimConfig
    records: list[RoundRecord] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # per round, coordinator.metrics.round_row schema
    trace_assignment: list[str] = field(default_factory=list)
    device_updates: int = 0  # local SGD steps actually computed, over all devices and rounds (= updates in unit step)
    wall_s: float = 0.0
    final_params: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        return self.records[-1].test_acc


class FixedParticipation:
    """A given s per device per round (cycled), e.g. to replay a live run: schedule[round][shard]."""

    def __init__(self, schedule, *, E: int) -> None:
        arr = np.asarray(schedule, dtype=np.int64)
        if arr.ndim != 2 or arr.size == 0:
            raise ConfigError(f"schedule must be a non-empty [rounds][devices] table, got shape {arr.shape}")
        if arr.min() < 0 or arr.max() > E:
            raise ConfigError(f"schedule values must lie in 0..E (E = {E})")
        self._schedule = arr

    def draw(self, shard: int, round_index: int) -> int:
        return int(self._schedule[(round_index - 1) % len(self._schedule), shard])


class TraceParticipation:
    """Each device follows a trace (assign_traces) and draws s from it (TraceSampler).

    `assignment` fixes the trace (index into the first num_traces) device k follows, e.g. a
    recorded set's own device -> trace map (trace_recorder.fidelity); None: assign_traces' draw.
    """

    def __init__(self, traces: TraceSet, cfg: SimConfig, *, assignment: Sequence[int] | None = None) -> None:
        chosen = traces.first(cfg.traces.num_traces)
        E = cfg.rules.required_updates
        if assignment is None:
            assignment = assign_traces(cfg.partition.n_devices, n_traces=len(chosen), seed=cfg.seed)
        elif len(assignment) != cfg.partition.n_devices or not all(0 <= j < len(chosen) for j in assignment):
            raise ConfigError(f"trace assignment {list(assignment)} must give each of {cfg.partition.n_devices} "
                              f"devices a trace index in 0..{len(chosen) - 1}")
        self.samplers = [TraceSampler(chosen[j], E=E, seed=cfg.seed, device_index=k,
                                      sampling=cfg.rules.trace_sampling, s_rule=cfg.rules.s_rule)
                         for k, j in enumerate(assignment)]
        self.trace_names = [s.trace.name for s in self.samplers]

    def draw(self, shard: int, round_index: int) -> int:
        return self.samplers[shard].draw(round_index)


def load_data(cfg: SimConfig) -> FederatedData:
    return build_federated(cfg.partition)


def run_simulation(
    cfg: SimConfig,
    *,
    data: FederatedData | None = None,
    traces: TraceSet | None = None,
    participation: FixedParticipation | TraceParticipation | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> SimResult:
    """Run `cfg.rounds` rounds and return per-round metrics and the final model.

    `participation` overrides the trace-driven s draws (e.g. FixedParticipation).
    """
    started = time.perf_counter()
    data = data if data is not None else load_data(cfg)
    if participation is None:
        participation = TraceParticipation(traces if traces is not None else read_trace_set(Path(cfg.traces.set)), cfg)
    run = _Run(cfg, data, participation)
    trainer = _Trainer(cfg, run.model, data)
    for tau in range(1, cfg.rounds + 1):
        t0 = time.perf_counter()
        work = run.begin(tau)
        deltas, losses = trainer.train(run.fed.params, work.shards, work.steps, lr=work.opening.lr, round_index=tau)
        record = run.end(work, deltas, losses, train_s=time.perf_counter() - t0)
        if on_round is not None:
            on_round(record)
    run.result.final_params = run.fed.params
    run.result.wall_s = time.perf_counter() - started
    return run.result


def run_paired(
    configs: Sequence[SimConfig],
    *,
    data: FederatedData | None = None,
    traces: Mapping[str, TraceSet] | None = None,
    checkpoint: Path | None = None,
    checkpoint_every_s: float = 300.0,
) -> list[SimResult]:
    """Run configs that share their data in lock-step, training each round's rows of all runs together.

    `checkpoint`: a file where the runs' state (each Federation, its records and rows) is
    saved atomically every `checkpoint_every_s` seconds; a later call with the same configs
    resumes from it after its last saved round (every draw is seeded per round, so the
    result is the uninterrupted one: tests/unit/simulator/test_paired.py). A file saved for
    other configs is ignored. The caller deletes it once the results are safe.

    Each config keeps its own Federation, model, s draws and minibatches, so result i
    equals run_simulation(configs[i]) to float tolerance (tests/unit/simulator/test_paired.py);
    only the local training of a round is one FastTrainer call over every run's
    contributors (each row starts from its run's model, at its run's learning rate).
    The configs must share the partition and the fast trainer's batch size; they may differ
    in anything else (scheme, fast-reboot, departure policy, schedule, seed, |T|, rounds).
    `traces` maps a config's traces.set to its trace set (read from disk when missing).
    A record's seconds are its run's share of the round: the shared training split evenly
    over the runs still going, plus its own close and evaluation; so the results' wall_s
    add up to the group's time.
    """
    if not configs:
        raise ConfigError("run_paired needs at least one config")
    first = configs[0]
    for i, cfg in enumerate(configs):
        if cfg.partition != first.partition:
            raise ConfigError(f"run_paired: config {i} has partition {cfg.partition.describe()}, config 0 has "
                              f"{first.partition.describe()}; paired runs share their data")
        if cfg.trainer_kind is not first.trainer_kind or not cfg.batched:
            raise ConfigError(f"run_paired: config {i} uses the {cfg.trainer_kind} trainer, config 0 the "
                              f"{first.trainer_kind}; paired runs train together in one row trainer (cache or fast; "
                              "run the plain one alone with run_simulation)")
        if cfg.rules.batch_size_for(cfg.partition.dataset) != first.rules.batch_size_for(first.partition.dataset):
            mine = cfg.rules.batch_size_for(cfg.partition.dataset)
            theirs = first.rules.batch_size_for(first.partition.dataset)
            raise ConfigError(f"run_paired: config {i} has batch size {mine}, config 0 {theirs}; "
                              "one trainer call needs one")
    data = data if data is not None else load_data(first)
    sets = dict(traces or {})
    for cfg in configs:
        if cfg.traces.set not in sets:
            sets[cfg.traces.set] = read_trace_set(Path(cfg.traces.set))
    # Runs with the same draws (the schemes of a seed) share one sampler and draw each s once.
    draws: dict[tuple, _SharedDraws] = {}
    runs = []
    for cfg in configs:
        r = cfg.rules
        key = (cfg.traces.set, cfg.traces.num_traces, cfg.seed, r.required_updates, r.trace_sampling, r.s_rule)
        if key not in draws:
            draws[key] = _SharedDraws(TraceParticipation(sets[cfg.traces.set], cfg))
        runs.append(_Run(cfg, data, draws[key]))
    fast = ROW_TRAINERS[first.trainer_kind](runs[0].model, data.train,
                                            batch_size=first.rules.batch_size_for(first.partition.dataset))
    n = len(data.train)
    out = {name: torch.empty((n * len(runs), *p.shape)) for name, p in runs[0].fed.params.items()}
    first_round = _restore(checkpoint, configs, runs) + 1
    saved_at = time.monotonic()
    for tau in range(first_round, max(c.rounds for c in configs) + 1):
        t0 = time.perf_counter()
        going = [i for i, c in enumerate(configs) if tau <= c.rounds]
        works = [runs[i].begin(tau) for i in going]
        # Rows of all runs, run after run; row j starts from model start_of_row[j] (its run's).
        bounds = np.cumsum([0] + [len(w.shards) for w in works])
        deltas, losses = {}, np.array([])
        if bounds[-1]:
            # One Generator per (seed, device): the runs of a seed share a device's minibatches.
            keys = [(configs[i].seed, k) for i, w in zip(going, works) for k in w.shards]
            generators = {key: device_rng(key[0], tau, key[1]) for key in set(keys)}
            start = {name: torch.stack([runs[i].fed.params[name] for i in going]) for name in out}
            deltas, losses = fast.train(
                start, shard_of_row=np.concatenate([w.shards for w in works]).astype(np.int64),
                steps=np.concatenate([w.steps for w in works]).astype(np.int64),
                lr=np.concatenate([np.full(len(w.shards), w.opening.lr) for w in works]),
                rngs=[generators[key] for key in keys],
                start_of_row=np.repeat(np.arange(len(works)), np.diff(bounds)), out=out,
                mu=np.concatenate([np.full(len(w.shards), configs[i].rules.aggregation.proximal_mu)
                                   for i, w in zip(going, works)]))
        # The shared training is split evenly; each run's close and evaluation is its own.
        share = (time.perf_counter() - t0) / len(going)
        for j, (i, w) in enumerate(zip(going, works)):
            lo, hi = bounds[j], bounds[j + 1]
            runs[i].end(w, {name: d[lo:hi] for name, d in deltas.items()} if hi > lo else {}, losses[lo:hi],
                        train_s=share)
        if checkpoint is not None and time.monotonic() - saved_at >= checkpoint_every_s:
            _save(checkpoint, configs, runs, tau)
            saved_at = time.monotonic()
    for run in runs:
        run.result.final_params = run.fed.params
        run.result.wall_s = sum(r.seconds for r in run.result.records)
    return [run.result for run in runs]


def _state_key(configs: Sequence[SimConfig]) -> str:
    from flexfl.config import to_dict

    return repr([to_dict(c) for c in configs])


def runs_alike(saved: object, cfg: SimConfig) -> bool:
    """A saved config (a dict as flexfl.config.to_dict wrote it) means `cfg` if it reads back
    equal where a run uses it (SimConfig.in_effect): fields added since, at their defaults,
    and the constants of departure policies the run never uses do not count."""
    from flexfl.config import from_dict

    try:
        return from_dict(SimConfig, saved, where="saved run").in_effect() == cfg.in_effect()
    except (ConfigError, TypeError):
        return False


def _same_configs(key: object, configs: Sequence[SimConfig]) -> bool:
    """A checkpoint's configs key (_state_key) means `configs` (runs_alike, pairwise)."""
    import ast

    if key == _state_key(configs):
        return True
    try:
        saved = ast.literal_eval(key) if isinstance(key, str) else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    return (isinstance(saved, list) and len(saved) == len(configs)
            and all(runs_alike(d, c) for d, c in zip(saved, configs)))


def _save(path: Path, configs: Sequence[SimConfig], runs: Sequence[_Run], tau: int) -> None:
    """The paired runs' state after round `tau`, written atomically."""
    from flexfl.files import atomic_file

    state = {"configs": _state_key(configs), "round": tau,
             "runs": [{"fed": r.fed, "records": r.result.records, "rows": r.result.rows,
                       "device_updates": r.result.device_updates} for r in runs]}
    with atomic_file(Path(path), "wb") as f:
        torch.save(state, f)
    log.info("checkpoint of %d paired runs after round %d: %s", len(runs), tau, path)


def _restore(path: Path | None, configs: Sequence[SimConfig], runs: Sequence[_Run]) -> int:
    """Load a checkpoint of these configs into `runs`; the last round it holds (0: none usable)."""
    if path is None or not Path(path).is_file():
        return 0
    try:
        state = torch.load(path, weights_only=False)
    except Exception as exc:  # a torn or foreign file: start over rather than fail the sweep
        log.warning("ignoring unreadable checkpoint %s: %s", path, exc)
        return 0
    if not isinstance(state, dict) or not _same_configs(state.get("configs"), configs):
        log.warning("ignoring checkpoint %s: saved for other configs", path)
        return 0
    for run, saved in zip(runs, state["runs"]):
        run.fed = saved["fed"]
        run.result.records, run.result.rows = saved["records"], saved["rows"]
        run.result.device_updates = saved["device_updates"]
    log.info("resuming %d paired runs after round %d from %s", len(runs), state["round"], path)
    return int(state["round"])


class _SharedDraws:
    """A TraceParticipation that paired runs in lock-step share: each (device, round) is drawn once."""

    def __init__(self, participation: TraceParticipation) -> None:
        self.participation = participation
        self.trace_names = participation.trace_names
        self._round, self._s = 0, {}

    def draw(self, shard: int, round_index: int) -> int:
        if round_index != self._round:
            self._round, self._s = round_index, {}
        if shard not in self._s:
            self._s[shard] = self.participation.draw(shard, round_index)
        return self._s[shard]


@dataclass(frozen=True)
class _RoundWork:
    """What one run needs trained in a round: its contributors' shards and s, at the round's rate."""

    opening: RoundOpening
    s: dict[str, int]
    weighing: Weighing
    rows: list[str]  # contributors, in the order of shards/steps
    shards: list[int]
    steps: list[int]  # SGD steps: s x steps_per_update of the device
    reasons: dict[str, str] | None = None  # why each s is what it is, where the participation knows (a timeline)


class _Run:
    """One run's state between rounds: its Federation, s draws and records; the caller trains."""

    def __init__(self, cfg: SimConfig, data: FederatedData,
                 participation: FixedParticipation | TraceParticipation | _SharedDraws) -> None:
        n = cfg.partition.n_devices
        if len(data.train) != n:
            raise ConfigError(f"data has {len(data.train)} devices, config asks for {n}")
        self.cfg, self.data, self.participation = cfg, data, participation
        self.model, params = initial_model(model_spec(cfg.partition.dataset, model=cfg.rules.model), seed=cfg.seed)
        self.fed = Federation(rules=cfg.rules, dataset=cfg.partition.dataset, params=params, horizon=cfg.rounds)
        late = {a.device for a in cfg.schedule.arrivals}
        self.start_shards = [k for k in range(n) if k not in late]
        self.fed.apply_events(arrivals=[Arrival(device_id(k), int(data.sample_counts[k]))
                                        for k in range(n) if k not in late])
        self.shard = {device_id(k): k for k in range(n)}
        batch = cfg.rules.batch_size_for(cfg.partition.dataset)
        self.steps_per_update = [steps_per_update(len(d), batch_size=batch, unit=cfg.rules.unit) for d in data.train]
        self.result = SimResult(config=cfg, trace_assignment=list(getattr(participation, "trace_names", [])))

    def begin(self, tau: int) -> _RoundWork:
        opening = self.fed.open(tau)
        outcome = getattr(self.participation, "outcome", None)  # a timeline's: s and why (trace_recorder.deadline)
        if outcome is not None:
            outcomes = {d: outcome(self.shard[d], tau) for d in opening.participants}
            s, reasons = {d: o.s for d, o in outcomes.items()}, {d: str(o.why) for d, o in outcomes.items()}
        else:
            s, reasons = {d: self.participation.draw(self.shard[d], tau) for d in opening.participants}, None
        weighing = self.fed.weigh(tau, s)
        rows = weighing.contributors  # only these change the model: train just them
        shards = [self.shard[d] for d in rows]
        return _RoundWork(opening=opening, s=s, weighing=weighing, rows=rows, shards=shards,
                          steps=[s[d] * self.steps_per_update[k] for d, k in zip(rows, shards)], reasons=reasons)

    def end(self, work: _RoundWork, deltas: Mapping[str, torch.Tensor], losses: np.ndarray, *,
            train_s: float) -> RoundRecord:
        """Close the round with the contributors' deltas (row i: work.rows[i]), evaluate, record.

        `losses` is each row's mean minibatch loss. The record's seconds are `train_s` (the
        round's time so far) plus this close and evaluation.
        """
        t0 = time.perf_counter()
        cfg, fed, s, weighing, rows = self.cfg, self.fed, work.s, work.weighing, work.rows
        tau = work.opening.round_index
        outcome = fed.close(
            weighing, deltas=deltas, rows=rows,
            arrivals=[Arrival(device_id(a.device), int(self.data.sample_counts[a.device]))
                      for a in cfg.schedule.arrivals if a.round == tau],
            departures=[Departure(device_id(d.device), d.policy) for d in cfg.schedule.departures if d.round == tau],
        )
        test = self.data.test_for([self.shard[d] for d in fed.objective.members()])
        acc, loss = evaluate(self.model, fed.params, test)
        extra = {}
        for name in cfg.extra_tests:
            shards = (self.start_shards if name is ExtraTest.START
                      else [self.shard[d] for d in fed.objective.active_members()])
            extra[str(name)] = dict(zip(("acc", "loss"), evaluate(self.model, fed.params, self.data.test_for(shards))))
        if not math.isfinite(loss):
            # Which run, too: paired runs train several configs in one loop (run_paired).
            raise DivergenceError(f"round {tau} of the {cfg.partition.dataset} run "
                                  f"({cfg.rules.aggregation.description}, E = {fed.E} {cfg.rules.unit}s, "
                                  f"seed {cfg.seed}): test loss became {loss}; "
                                  f"the learning rate {work.opening.lr:g} is too high for this setup")
        self.result.device_updates += sum(work.steps)
        coef = {d: c for d, c in zip(weighing.devices, weighing.coefficients.values)}
        w = np.array([coef[d] for d in rows])
        record = RoundRecord(
            round=tau, lr=work.opening.lr, active=sum(v > 0 for v in s.values()),
            complete=sum(v == fed.E for v in s.values()), mean_s=float(np.mean(list(s.values()))) if s else 0.0,
            coef_sum=float(weighing.coefficients.values.sum()), discarded=weighing.coefficients.discarded,
            train_loss=float(np.dot(w, losses) / w.sum()) if len(rows) and w.sum() > 0 else float("nan"),
            test_acc=acc, test_loss=loss, seconds=train_s + time.perf_counter() - t0,
            members=len(fed.objective.members()),
            events=" ".join([f"+{d}" for d in outcome.arrivals] + [f"-{d}({p})" for d, p in outcome.departures]),
        )
        self.result.records.append(record)
        row = round_row(work.opening, outcome, test_acc=acc, test_loss=loss)
        if extra:
            row["extra_tests"] = extra
        if work.reasons is not None:  # as a live run's rows record it (coordinator.finisher)
            row["stop_reason"] = work.reasons
        self.result.rows.append(row)
        return record


class _Trainer:
    """Local training of the round's contributors: all together (fast) or edge_agent.trainer per device."""

    def __init__(self, cfg: SimConfig, model: torch.nn.Module, data: FederatedData) -> None:
        self.cfg = cfg
        self.model = model
        self.data = data
        self.batch_size = cfg.rules.batch_size_for(cfg.partition.dataset)
        self.mu = cfg.rules.aggregation.proximal_mu  # FedProx's local term (0: plain SGD)
        self.fast = ROW_TRAINERS[cfg.trainer_kind](model, data.train,
                                                   batch_size=self.batch_size) if cfg.batched else None
        self._out: dict[str, torch.Tensor] | None = None  # delta buffers kept from round to round

    def train(self, params: Mapping[str, torch.Tensor], shards: list[int], steps: list[int], *, lr: float,
              round_index: int) -> tuple[dict[str, torch.Tensor], np.ndarray]:
        """Deltas stacked in `shards` order (row i: steps[i] SGD steps) and each row's mean minibatch loss."""
        if not shards:
            return {}, np.array([])
        rngs = [device_rng(self.cfg.seed, round_index, k) for k in shards]
        if self.fast is not None:
            if self._out is None:
                n = len(self.data.train)
                self._out = {name: torch.empty((n, *p.shape)) for name, p in params.items()}
            return self.fast.train(dict(params), shard_of_row=shards, steps=steps, lr=lr, rngs=rngs, out=self._out,
                                   mu=self.mu)
        deltas, losses = [], []
        for k, s, rng in zip(shards, steps, rngs):
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    p.copy_(params[name])
            # `steps` already counts epochs as their steps (same stream: edge_agent.trainer).
            res = train_local(self.model, self.data.train[k], updates=s, lr=lr, batch_size=self.batch_size, rng=rng,
                              unit="step", mu=self.mu)
            deltas.append(res.delta)
            losses.append(res.mean_loss)
        return stack_deltas(deltas), np.array(losses)


def records_as_rows(result: SimResult) -> list[dict]:
    """Per-round rows for CSV output, each with the run's identifying config fields."""
    c = result.config
    part = c.partition.identity()
    ident = {
        "dataset": part["dataset"], "iid": int(part["iid"]), "alpha": part.get("alpha"), "beta": part.get("beta"),
        "num_traces": c.traces.num_traces, "scheme": c.rules.aggregation.label, "seed": c.seed,
    }
    return [{**ident, **asdict(r)} for r in result.records]
