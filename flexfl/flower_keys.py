"""The keys a Flower run under FlexFL's rules speaks in, version 1: one table for the strategy and the clients.

coordinator.flower_strategy (the server side) writes CONFIG_KEYS into each train message's
ConfigRecord and reads METRIC_KEYS from each reply's MetricRecord; edge_agent.flower_client (the
client side) does the opposite. docs/flower.md is the user-facing description. Flower itself is
not needed to import this module.

Train ConfigRecord ("config"), sent by the strategy:
- round: the round tau (int); E: the local updates asked for (int); lr: the round's learning rate;
- mu: FedProx's proximal weight (0.0 for the other strategies); deadline_s: the round's deadline,
  counted from the message's arrival (0.0: none);
- seed, trace_sampling, s_rule: what a client that follows a FlexFL trace needs to draw s as
  the simulator and FlexFL's agents do (trace_recorder.sampler.TraceSampler);
- keys_version: this module's VERSION.

Train reply MetricRecord ("metrics"), beside the ArrayRecord "arrays" (the local model after training):
- samples: n_k, the client's training samples ("num-examples", Flower's own key; required);
- s: local updates completed, 0..E (absent: E);
- stop_reason: why s is what it is, fleet.proto's StopReason number (1 complete, 2 compute,
  3 upload, 4 trace, 5 stopped; a MetricRecord holds numbers only);
- leaving: 1 when the client leaves after this round: its work of the round counts and it departs
  at the round's close (a FlexFL agent's Leave after its last upload); absent or 0: it stays;
- train_s: the seconds its local training took this round (optional; Flower fleets as traces).
"""

from __future__ import annotations

VERSION = 1

CONFIG_KEYS = {"round": "flexfl.round", "E": "flexfl.E", "lr": "flexfl.lr", "mu": "flexfl.mu",
               "deadline_s": "flexfl.deadline_s", "seed": "flexfl.seed", "trace_sampling": "flexfl.trace_sampling",
               "s_rule": "flexfl.s_rule", "keys_version": "flexfl.keys_version"}
METRIC_KEYS = {"samples": "num-examples", "s": "flexfl.s", "stop_reason": "flexfl.stop_reason",
               "leaving": "flexfl.leaving", "train_s": "flexfl.train_s"}
ARRAYS, METRICS, CONFIG = "arrays", "metrics", "config"  # the records' names in a message (Flower's defaults)
