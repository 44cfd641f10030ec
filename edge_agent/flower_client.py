"""FlexFL's participation rules for a Flower ClientApp: race the round's deadline, or follow a FlexFL trace.

DeadlineTraining is the agent's deadline rule (edge_agent/deadline.py: RoundBudget, UpdateGate,
Estimates), not a copy: from the moment the round's model arrives the client has the deadline that
coordinator.flower_strategy sent (`flexfl.deadline_s` in the train ConfigRecord), starts one more
local update only while that update, the upload and a safety margin still fit, and reports how many
it did (s) and why it stopped, in the keys of flexfl.flower_keys. The training loop stays the user's:

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        budget = DeadlineTraining.start(msg, context)        # the clock starts now
        model.load_state_dict(budget.global_state())
        for _ in budget.updates():                           # at most E; each one: one local update
            one_local_update(model, lr=budget.lr)
        return budget.reply(model.state_dict(), num_examples=len(my_data))

The estimates the rule weighs are what this client measured: the time of one update (kept across
rounds in the ClientApp's context.state) and the upload, which a ClientApp cannot time itself:
give `upload_s` (e.g. the model's bytes over the link's rate) or it counts as 0.

TraceTraining is the same loop for Flower's Simulation Engine with s drawn from a FlexFL trace, as
FlexFL's simulator and its trace-mode agents draw it (trace_recorder.sampler.TraceSampler, with the
seed and sampling rules the strategy sends): `TraceTraining.start(msg, context, trace=...,
device_index=k)`; `trace_for` picks device k's trace of a set as the simulator assigns them.
Needs the [flower] extra.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from edge_agent.deadline import Estimates, RoundBudget, UpdateGate
from edge_agent.transport import wire_stop_reason
from flexfl.flower_keys import ARRAYS, CONFIG, CONFIG_KEYS, METRIC_KEYS, METRICS
from flexfl.vocabulary import StopReason
from trace_recorder.format import Trace, TraceSet
from trace_recorder.sampler import TraceSampler, assign_traces

STATE_KEY = "flexfl.estimates"  # context.state's ConfigRecord holding the update estimate across rounds
SAFETY_MARGIN_S = 0.05  # as edge_agent.config.AgentConfig.safety_margin_s


@dataclass
class _FlowerRound:
    """What both kinds of round share: the strategy's terms, the count s, the reply."""

    message: Message
    context: Context
    E: int
    lr: float
    mu: float  # FedProx's proximal weight for the local objective (0.0: plain SGD)
    round: int
    s: int = 0
    train_s: float | None = None  # the local updates' seconds, where the round measured them (reply's default)

    def global_state(self) -> dict[str, torch.Tensor]:
        """The round's global model (the message's ArrayRecord) as a torch state dict."""
        return self.message.content.array_records[ARRAYS].to_torch_state_dict()

    @property
    def stop_reason(self) -> StopReason:
        raise NotImplementedError

    def reply(self, state: Mapping[str, torch.Tensor], *, num_examples: int, s: int | None = None,
              leaving: bool = False, train_s: float | None = None) -> Message:
        """The train reply: the local model, and n_k, s and the stop reason in the strategy's metric keys.

        `s`: the updates completed where the loop was not updates() (e.g. edge_agent.trainer.train_local
        with updates=budget.cap); `leaving`: this is the client's last round (its work counts, and it
        departs at the round's close); `train_s`: its local training's seconds (default: what updates()
        measured, under DeadlineTraining).
        """
        if s is not None:
            self.s = s
        train_s = self.train_s if train_s is None else train_s
        metrics = MetricRecord({METRIC_KEYS["samples"]: int(num_examples), METRIC_KEYS["s"]: self.s,
                                METRIC_KEYS["stop_reason"]: wire_stop_reason(self.stop_reason),
                                METRIC_KEYS["leaving"]: int(leaving)})
        if train_s is not None:
            metrics[METRIC_KEYS["train_s"]] = float(train_s)
        content = RecordDict({ARRAYS: ArrayRecord({k: v.detach() for k, v in state.items()}), METRICS: metrics})
        return Message(content=content, reply_to=self.message)


@dataclass
class DeadlineTraining(_FlowerRound):
    """One round of a ClientApp under FlexFL's deadline rule (start() it when the train message arrives)."""

    gate: UpdateGate = field(default_factory=lambda: UpdateGate(budget=None, stopping=lambda: False))
    estimates: Estimates = field(default_factory=Estimates)
    started: float = 0.0

    @classmethod
    def start(cls, message: Message, context: Context, *, upload_s: float = 0.0, margin_s: float = SAFETY_MARGIN_S,
              counting_from: str = "start") -> DeadlineTraining:
        """The round's budget, from the strategy's terms in `message` (flexfl.E, flexfl.lr, flexfl.deadline_s).

        `counting_from`: "start", the deadline counts from this call (the client's own clock only); "sent", from
        when the strategy made the message (its metadata's created_at, a Unix time: on one machine or clocks kept
        by NTP), so what happened before this call (Flower's Deployment Engine starts a ClientApp process for each
        message: imports, data) is spent from the round's budget, and a round's replies arrive by the deadline
        as a FlexFL coordinator's do.
        """
        config = _config(message)
        E, deadline_s = int(_number(config, CONFIG_KEYS["E"])), _number(config, CONFIG_KEYS["deadline_s"], 0.0)
        kept = context.state.config_records.get(STATE_KEY)
        estimates = Estimates(update_s=_number(kept, "update_s") if kept and "update_s" in kept else None,
                              upload_s=upload_s or None)
        now = time.monotonic()
        if counting_from == "sent":
            deadline_at = now + (message.metadata.created_at + deadline_s - time.time())
        elif counting_from == "start":
            deadline_at = now + deadline_s
        else:
            raise ValueError(f"counting_from must be 'start' or 'sent', got {counting_from!r}")
        budget = RoundBudget(deadline_at=deadline_at, estimates=estimates, margin_s=margin_s) \
            if deadline_s > 0 else None  # no deadline: all E updates, as forced participation
        return cls(message=message, context=context, E=E, **_terms(config),
                   gate=UpdateGate(budget=budget, stopping=lambda: False), estimates=estimates, started=now)

    def updates(self) -> Iterator[int]:
        """Yield once per local update the rule allows (at most E): the loop body is that update."""
        t0 = time.monotonic()
        while self.s < self.E and self.gate(self.s):
            yield self.s
            self.s += 1
        self.train_s = time.monotonic() - t0
        self.estimates.measured_updates(updates=self.s, seconds=self.train_s)
        if self.estimates.update_s is not None:
            self.context.state.config_records[STATE_KEY] = ConfigRecord({"update_s": self.estimates.update_s})

    @property
    def stop_reason(self) -> StopReason:
        """Why the round ended at s (FlexFL's why_stopped: complete, compute or upload)."""
        return self.gate.why_stopped(s=self.s, E=self.E)


@dataclass
class TraceTraining(_FlowerRound):
    """One round of a ClientApp whose s this round is drawn from a FlexFL trace (Flower's Simulation Engine).

    `cap` is the draw: trace_recorder.sampler.TraceSampler with the strategy's E, seed, trace
    sampling and s rule and this client's device index, so device k of a Flower simulation does in
    round tau the s that device k of `flexfl sim run` with the same seed and traces does.
    """

    cap: int = 0

    @classmethod
    def start(cls, message: Message, context: Context, *, trace: Trace, device_index: int) -> TraceTraining:
        config = _config(message)
        E, tau = int(_number(config, CONFIG_KEYS["E"])), int(_number(config, CONFIG_KEYS["round"]))
        sampler = TraceSampler(trace, E=E, seed=int(_number(config, CONFIG_KEYS["seed"])), device_index=device_index,
                               sampling=_text(config, CONFIG_KEYS["trace_sampling"]),
                               s_rule=_text(config, CONFIG_KEYS["s_rule"]))
        return cls(message=message, context=context, E=E, **_terms(config), cap=sampler.draw(tau))

    def updates(self) -> Iterator[int]:
        """Yield once per local update the trace allows this round (s of E; 0: an inactive round)."""
        while self.s < self.cap:
            yield self.s
            self.s += 1

    @property
    def stop_reason(self) -> StopReason:
        """complete at E, trace below it (the trace capped s), as a FlexFL agent in trace mode says."""
        return StopReason.COMPLETE if self.s >= self.E else StopReason.TRACE


def trace_for(traces: TraceSet, *, device_index: int, n_devices: int, num_traces: int, seed: int) -> Trace:
    """The trace device `device_index` of `n_devices` follows, as the simulator assigns the first `num_traces`."""
    chosen = traces.first(num_traces)
    return chosen[int(assign_traces(n_devices, n_traces=len(chosen), seed=seed)[device_index])]


def _config(message: Message) -> ConfigRecord:
    return message.content.config_records.get(CONFIG, ConfigRecord())


def _terms(config: ConfigRecord) -> dict[str, Any]:
    """The round's terms both kinds of round keep: its learning rate, FedProx's mu, its index."""
    return {"lr": _number(config, CONFIG_KEYS["lr"]), "mu": _number(config, CONFIG_KEYS["mu"], 0.0),
            "round": int(_number(config, CONFIG_KEYS["round"]))}


def _text(record: ConfigRecord, key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise ValueError(f"the train message's ConfigRecord needs a string {key!r} (sent by "
                         f"coordinator.flower_strategy.FlexFLStrategy), got {value!r}")
    return value


def _number(record: ConfigRecord, key: str, default: float | None = None) -> float:
    """A number of the strategy's terms; a missing or non-numeric one says which key (not FlexFL's strategy?)."""
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the train message's ConfigRecord needs a number {key!r} (sent by "
                         f"coordinator.flower_strategy.FlexFLStrategy), got {value!r}")
    return float(value)
