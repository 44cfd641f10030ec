"""FlexFL's deadline rule for a Flower ClientApp: local updates while the next one and the upload still fit.

The rule is the agent's own (edge_agent/deadline.py: RoundBudget, UpdateGate, Estimates), not a copy:
from the moment the round's model arrives the client has the deadline that coordinator.flower_strategy
sent (`flexfl.deadline_s` in the train ConfigRecord), starts one more local update only while that
update, the upload and a safety margin still fit, and reports how many it did (s) and why it
stopped, in the metric keys the strategy reads. The training loop stays the user's:

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        budget = DeadlineTraining.start(msg, context)        # the clock starts now
        model.load_state_dict(budget.global_state())
        for _ in budget.updates():                           # at most E; each one: one local update
            one_local_update(model, lr=budget.lr)
        return budget.reply(model.state_dict(), num_examples=len(my_data))

The estimates the rule weighs are what this client measured: the time of one update (kept across
rounds in the ClientApp's context.state) and the upload, which a ClientApp cannot time itself:
give `upload_s` (e.g. the model's bytes over the link's rate) or it counts as 0. Needs the
[flower] extra.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from edge_agent.deadline import Estimates, RoundBudget, UpdateGate
from edge_agent.transport import wire_stop_reason
from flexfl.vocabulary import StopReason

STATE_KEY = "flexfl.estimates"  # context.state's ConfigRecord holding the update estimate across rounds
SAFETY_MARGIN_S = 0.05  # as edge_agent.config.AgentConfig.safety_margin_s


@dataclass
class DeadlineTraining:
    """One round of a ClientApp under FlexFL's deadline rule (start() it when the train message arrives)."""

    message: Message
    context: Context
    E: int
    lr: float
    gate: UpdateGate
    estimates: Estimates
    started: float
    s: int = 0

    @classmethod
    def start(cls, message: Message, context: Context, *, upload_s: float = 0.0,
              margin_s: float = SAFETY_MARGIN_S) -> DeadlineTraining:
        """The round's budget, from the strategy's terms in `message` (flexfl.E, flexfl.lr, flexfl.deadline_s)."""
        config = message.content.config_records.get("config", ConfigRecord())
        E, deadline_s = int(_number(config, "flexfl.E")), _number(config, "flexfl.deadline_s", 0.0)
        kept = context.state.config_records.get(STATE_KEY)
        estimates = Estimates(update_s=_number(kept, "update_s") if kept and "update_s" in kept else None,
                              upload_s=upload_s or None)
        now = time.monotonic()
        budget = RoundBudget(deadline_at=now + deadline_s, estimates=estimates, margin_s=margin_s) \
            if deadline_s > 0 else None  # no deadline: all E updates, as forced participation
        return cls(message=message, context=context, E=E, lr=_number(config, "flexfl.lr"),
                   gate=UpdateGate(budget=budget, stopping=lambda: False), estimates=estimates, started=now)

    def global_state(self) -> dict[str, torch.Tensor]:
        """The round's global model (the message's ArrayRecord) as a torch state dict."""
        return self.message.content.array_records["arrays"].to_torch_state_dict()

    def updates(self) -> Iterator[int]:
        """Yield once per local update the rule allows (at most E): the loop body is that update."""
        t0 = time.monotonic()
        while self.s < self.E and self.gate(self.s):
            yield self.s
            self.s += 1
        self.estimates.measured_updates(updates=self.s, seconds=time.monotonic() - t0)
        if self.estimates.update_s is not None:
            self.context.state.config_records[STATE_KEY] = ConfigRecord({"update_s": self.estimates.update_s})

    @property
    def stop_reason(self) -> StopReason:
        """Why the round ended at s (FlexFL's why_stopped: complete, compute or upload)."""
        return self.gate.why_stopped(s=self.s, E=self.E)

    def reply(self, state: Mapping[str, torch.Tensor], *, num_examples: int) -> Message:
        """The train reply: the local model, and n_k, s and the stop reason in the strategy's metric keys."""
        metrics = MetricRecord({"num-examples": int(num_examples), "flexfl.s": self.s,
                                "flexfl.stop_reason": wire_stop_reason(self.stop_reason)})
        content = RecordDict({"arrays": ArrayRecord({k: v.detach() for k, v in state.items()}), "metrics": metrics})
        return Message(content=content, reply_to=self.message)


def _number(record: ConfigRecord, key: str, default: float | None = None) -> float:
    """A number of the strategy's terms; a missing or non-numeric one says which key (not FlexFL's strategy?)."""
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the train message's ConfigRecord needs a number {key!r} (sent by "
                         f"coordinator.flower_strategy.FlexFLStrategy), got {value!r}")
    return float(value)
