"""What a round did, as one typed record: written by the live coordinator and the simulator, read by everyone.

A metrics.jsonl line is `RoundRecord.to_json()`; `RoundRecord.from_json` reads it back, and
reads every older line too: fields that later versions added are optional here (a row
written before `founded` existed has none, ...). Nothing outside this module reads a row by
its keys, so a renamed field fails a type check, not a page three modules away.

The parts:
- the fields every round has, live or simulated (who took part, s, p, coefficients, events,
  test metrics);
- `live`: what only a live round measures (transfers, times, refusals), None in a simulation;
- what the simulator measures beside them (train_loss, seconds, members, and clock_s on its simulated
  clock: simulator.clock), None in a live round;
- `rules`: the run's rules as data (flexfl.config.to_dict of coordinator.rules.config.RulesConfig),
  and `rule_changes`: in the first row after a resume under changed rules, what changed.
Counts that follow from s (active, complete, mean_s, coef_sum, events) are properties, not fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from flexfl.config import to_dict
from flexfl.errors import FlexFLError

if TYPE_CHECKING:
    from coordinator.rules.config import RulesConfig
    from coordinator.rules.round import RoundOpening, RoundOutcome

T = TypeVar("T")


class RoundRecordError(FlexFLError):
    """A metrics row that is not a round record: a field missing or of the wrong type (the message says where)."""


@dataclass(frozen=True)
class LiveRound:
    """What a live round's record holds beside the common fields: transfers, times and refusals,
    per device where per device. Fields added after the first live rows are optional (None or empty)."""

    time: float  # unix time the row was made
    close_reason: str  # "all answered" or "deadline" (a Flower round: "all answered" or "timeout")
    bytes_out: Mapping[str, int]  # protobuf message bytes of the model sent
    bytes_in: Mapping[str, int]  # protobuf message bytes of the update received
    train_s: Mapping[str, float]  # as the device measured it
    local_loss: Mapping[str, float]
    rejected: Mapping[str, tuple[str, ...]]  # refused updates' reasons, in order
    round_s: float  # opening -> close
    aggregate_eval_s: float  # close -> evaluated
    overhead_s: float | None  # the last close -> this opening (None: the first round of this process)
    left_during_round: tuple[str, ...] = ()
    previous_upload_s: Mapping[str, float] = field(default_factory=dict)  # the device's measure of its previous upload
    arrived_after_s: Mapping[str, float] = field(default_factory=dict)  # model delivered -> update arrived
    delivered_after_s: Mapping[str, float] = field(default_factory=dict)  # opening -> model handed over
    aggregate_s: float | None = None  # on the path between rounds
    eval_s: float | None = None  # beside the next round
    pull_wakeups: int | None = None  # parked pulls woken while the round was open


@dataclass(frozen=True)
class RoundRecord:
    """One round: the common fields, then the optional parts (see the module docstring)."""

    round: int
    lr: float
    participants: tuple[str, ...]  # devices the round was opened for (under client sampling: the drawn ones)
    devices: tuple[str, ...]  # the objective's members at the close (the keys of s, p, coefficients)
    s: Mapping[str, int]
    p: Mapping[str, float]  # base weights, fast-reboot boost included
    coefficients: Mapping[str, float]
    discarded: bool
    test_acc: float  # nan: not evaluated
    test_loss: float
    arrivals: tuple[str, ...] = ()  # applied at this round's close
    founded: tuple[str, ...] = ()  # arrivals that found an empty objective (no boost)
    departures: tuple[str, ...] = ()
    departure_policies: Mapping[str, str] = field(default_factory=dict)  # departed device -> policy applied
    departure_gammas: Mapping[str, float | None] = field(default_factory=dict)  # None: no estimate yet
    remembered: tuple[str, ...] = ()  # MIFA: devices whose memory is in w (coefficients are this round's only)
    # Client sampling ([rules] sample_k): each drawn device -> times drawn (uniform: 1); None: every available device
    sampled: Mapping[str, int] | None = None
    stop_reason: Mapping[str, str] | None = None  # why each s is what it is (edge_agent.deadline.StopReason)
    extra_tests: Mapping[str, Mapping[str, float]] | None = None  # simulator: test set name -> {"acc", "loss"}
    train_loss: float | None = None  # simulator: coefficient-weighted mean local loss of contributors
    seconds: float | None = None  # simulator: the round's wall time
    clock_s: float | None = None  # simulator: the simulated clock at the round's close, seconds (simulator.clock)
    # An asynchronous server step (simulator.async_run): each device's oldest update's staleness, server steps
    staleness: Mapping[str, int] | None = None
    members: int | None = None  # simulator: devices in the objective after the round
    live: LiveRound | None = None
    rules: Mapping[str, Any] | None = None  # the run's rules (flexfl.config.to_dict(RulesConfig)); old rows: None
    rule_changes: Mapping[str, tuple[Any, Any]] | None = None  # setting -> (old, new), after a changed resume

    @classmethod
    def of(cls, opening: RoundOpening, outcome: RoundOutcome, *, test_acc: float, test_loss: float) -> RoundRecord:
        """The common fields of a closed round (the live and simulated engines add their parts with replace)."""
        w = outcome.weighing
        return cls(
            round=w.round_index, lr=outcome.lr, participants=tuple(opening.participants), devices=tuple(w.devices),
            s={d: int(v) for d, v in zip(w.devices, w.s)}, p={d: float(v) for d, v in zip(w.devices, w.p)},
            coefficients={d: float(v) for d, v in zip(w.devices, w.coefficients.values)},
            discarded=w.coefficients.discarded, test_acc=test_acc, test_loss=test_loss,
            arrivals=tuple(outcome.arrivals), founded=tuple(outcome.founded),
            departures=tuple(d for d, _ in outcome.departures),
            departure_policies={d: str(policy) for d, policy in outcome.departures},
            departure_gammas=dict(outcome.departure_gammas), remembered=tuple(sorted(outcome.remembered)),
            sampled=None if opening.draw is None else dict(opening.draw.counts))

    # -- counts that follow from s and E ------------------------------------------------------------

    @property
    def E(self) -> int | None:
        """Required updates of the run's rules (None: a row written before rows recorded them)."""
        value = (self.rules or {}).get("required_updates")
        return int(value) if value is not None else None

    @property
    def active(self) -> int:
        """Devices with s > 0."""
        return sum(v > 0 for v in self.s.values())

    @property
    def complete(self) -> int | None:
        """Devices with s = E (None without the rules)."""
        E = self.E
        return None if E is None else sum(v == E for v in self.s.values())

    @property
    def mean_s(self) -> float:
        """Mean s over the round's devices (0 when it had none)."""
        return sum(self.s.values()) / len(self.s) if self.s else 0.0

    @property
    def coef_sum(self) -> float:
        return float(sum(self.coefficients.values()))

    @property
    def events(self) -> str:
        """"+dev-3 -dev-0(exclude)": arrivals and departures applied at the round's close."""
        return " ".join([f"+{d}" for d in self.arrivals]
                        + [f"-{d}({self.departure_policies.get(d, '?')})" for d in self.departures])

    # -- JSON ---------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one metrics.jsonl line (non-finite floats as null; empty optional parts left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "live":
                if value is not None:
                    out.update({lf.name: clean_json(getattr(value, lf.name)) for lf in fields(LiveRound)})
            elif f.name == "rule_changes":
                if value:
                    out[f.name] = {k: [clean_json(old), clean_json(new)] for k, (old, new) in value.items()}
            elif value is None or (f.name == "remembered" and not value):
                continue  # rows stay as they were where a part does not apply
            else:
                out[f.name] = clean_json(value)
        return out

    @classmethod
    def from_json(cls, obj: object, *, where: str) -> RoundRecord:
        """A record from one metrics.jsonl line's object; `where` ("path:line") names it in errors."""
        if not isinstance(obj, dict):
            raise RoundRecordError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
        r = _Reader(obj, where)
        changes = r.opt("rule_changes", _object)
        return cls(
            round=r.req("round", _int), lr=r.req("lr", _float), participants=r.req("participants", _ids),
            devices=r.req("devices", _ids), s=r.req("s", _map(_int)), p=r.req("p", _map(_float)),
            coefficients=r.req("coefficients", _map(_float)), discarded=r.req("discarded", _bool),
            test_acc=r.req("test_acc", _float), test_loss=r.req("test_loss", _float),
            arrivals=r.opt("arrivals", _ids) or (), founded=r.opt("founded", _ids) or (),
            departures=r.opt("departures", _ids) or (),
            departure_policies=r.opt("departure_policies", _map(_str)) or {},
            departure_gammas=r.opt("departure_gammas", _map(_float_or_none)) or {},
            remembered=r.opt("remembered", _ids) or (), sampled=r.opt("sampled", _map(_int)),
            stop_reason=r.opt("stop_reason", _map(_str)),
            extra_tests=r.opt("extra_tests", _map(_map(_float))), train_loss=r.opt("train_loss", _float),
            seconds=r.opt("seconds", _float), clock_s=r.opt("clock_s", _float), members=r.opt("members", _int),
            staleness=r.opt("staleness", _map(_int)),
            live=_live(r) if "close_reason" in obj else None, rules=r.opt("rules", _object),
            rule_changes=None if changes is None else {k: r.pair(f"rule_changes.{k}", v) for k, v in changes.items()},
        )


def rules_record(rules: RulesConfig, *, dataset: str) -> dict[str, Any]:
    """A run's rules as the record holds them: RulesConfig as data, the paper's eta0 and batch size filled in
    (a run that leaves eta0 out trains with the dataset's: a resume that names that value changes nothing)."""
    return to_dict(replace(rules, eta0=rules.eta0_for(dataset), batch_size=rules.batch_size_for(dataset)))


def rule_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Setting -> (old, new) for each setting that differs, nested tables as dotted names ("strategy.mu")."""
    flat_old, flat_new = _flat(_without_older_scheme(old)), _flat(_without_older_scheme(new))
    return {k: (flat_old.get(k), flat_new.get(k)) for k in sorted(flat_old.keys() | flat_new.keys())
            if flat_old.get(k) != flat_new.get(k)}


def _without_older_scheme(rules: Mapping[str, Any]) -> Mapping[str, Any]:
    """Rules as written now: records written before [rules] took scheme or strategy, not both, hold scheme = "C"
    beside a strategy (the scheme its strategy left at its default)."""
    if rules.get("strategy") is not None and "scheme" in rules:
        return {k: v for k, v in rules.items() if k != "scheme"}
    return rules


def _flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _live(r: _Reader) -> LiveRound:
    return LiveRound(
        time=r.req("time", _float), close_reason=r.req("close_reason", _str),
        bytes_out=r.req("bytes_out", _map(_int)), bytes_in=r.req("bytes_in", _map(_int)),
        train_s=r.req("train_s", _map(_float)), local_loss=r.req("local_loss", _map(_float)),
        rejected=r.req("rejected", _map(_ids)), round_s=r.req("round_s", _float),
        aggregate_eval_s=r.req("aggregate_eval_s", _float), overhead_s=r.opt("overhead_s", _float),
        left_during_round=r.opt("left_during_round", _ids) or (),
        previous_upload_s=r.opt("previous_upload_s", _map(_float)) or {},
        arrived_after_s=r.opt("arrived_after_s", _map(_float)) or {},
        delivered_after_s=r.opt("delivered_after_s", _map(_float)) or {},
        aggregate_s=r.opt("aggregate_s", _float), eval_s=r.opt("eval_s", _float),
        pull_wakeups=r.opt("pull_wakeups", _int),
    )


# -- reading one line's fields with errors that say where ------------------------------------------


class _Wrong(Exception):
    """A value of the wrong type: what was expected and what came (the reader adds where)."""


def _wrong(expected: str, got: Any) -> _Wrong:
    return _Wrong(f"expected {expected}, got {got!r}")


class _Reader:
    def __init__(self, obj: dict[str, Any], where: str) -> None:
        self.obj, self.where = obj, where

    def req(self, name: str, kind: Callable[[Any], T]) -> T:
        if name not in self.obj:
            raise RoundRecordError(f"{self.where}: field '{name}': missing")
        return self._read(name, self.obj[name], kind)

    def opt(self, name: str, kind: Callable[[Any], T]) -> T | None:
        value = self.obj.get(name)
        return None if value is None else self._read(name, value, kind)

    def pair(self, name: str, value: Any) -> tuple[Any, Any]:
        if not isinstance(value, list) or len(value) != 2:
            raise RoundRecordError(f"{self.where}: field '{name}': expected [old, new], got {value!r}")
        return value[0], value[1]

    def _read(self, name: str, value: Any, kind: Callable[[Any], T]) -> T:
        try:
            return kind(value)
        except _Wrong as exc:
            raise RoundRecordError(f"{self.where}: field '{name}': {exc}") from None


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _wrong("an integer", v)
    return v


def _float(v: Any) -> float:
    # null is how a non-finite float was written (JSON has no NaN): it reads back as nan
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _wrong("a number", v)
    return float(v)


def _float_or_none(v: Any) -> float | None:
    return None if v is None else _float(v)


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _wrong("true or false", v)
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise _wrong("a string", v)
    return v


def _object(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _wrong("an object", v)
    return v


def _ids(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _wrong("a list of strings (device ids, or reasons)", v)
    return tuple(v)


def _map(kind: Callable[[Any], T]) -> Callable[[Any], dict[str, T]]:
    def read(v: Any) -> dict[str, T]:
        if not isinstance(v, dict):
            raise _wrong("an object of device id -> value", v)
        out = {}
        for k, x in v.items():
            try:
                out[str(k)] = kind(x)
            except _Wrong as exc:
                raise _Wrong(f"at key {k!r}: {exc}") from None
        return out
    return read


def clean_json(value: Any) -> Any:
    """JSON values: tuples and mappings as lists and objects, non-finite floats as null (JSON has no
    NaN/Inf: every line then parses with strict readers). Every metrics and run file is written through it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value
