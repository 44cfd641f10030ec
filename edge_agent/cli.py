"""`flexfl agent`: run an edge agent against a coordinator."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

from edge_agent.config import AgentConfig, load_agent_config

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="run an edge agent (joins a coordinator and trains)",
                       description="Run an edge agent: it dials the coordinator (it needs no open port), joins with "
                                   "the fleet token, and each round trains on its shard of the coordinator's data "
                                   "split until the deadline's budget runs out, then uploads what it has. Settings: "
                                   "the --config file (edge_agent/example.toml), then these flags.")
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML config (see edge_agent/example.toml)")
    p.add_argument("--coordinator", metavar="HOST:PORT",
                   help=f"the coordinator's address (default {AgentConfig.coordinator})")
    p.add_argument("--device-id", dest="device_id", metavar="ID",
                   help=f"this device's name (default {AgentConfig.device_id})")
    p.add_argument("--token-file", dest="fleet_token_file", metavar="FILE",
                   help="the fleet token (`flexfl token --out FILE` makes one)")
    p.add_argument("--shard-index", dest="shard_index", type=int, metavar="K",
                   help=f"train on shard K of the coordinator's data split (default {AgentConfig.shard_index})")
    p.add_argument("--give-up-after", dest="give_up_after_s", type=float, metavar="SECONDS",
                   help="exit with an error (code 2) after SECONDS of failing to reach the coordinator "
                        "(default: keep retrying; config key give_up_after_s)")
    p.add_argument("--trace", help="FOLDER:NAME participation trace that caps s per round")
    p.add_argument("--no-train", dest="no_train", action="store_true", default=None,
                   help="benchmark mode: skip SGD, send a zero delta with s = E")
    p.add_argument("--silent-exit", dest="silent", action="store_true",
                   help="on SIGTERM just go silent instead of announcing a departure")
    p.set_defaults(func=cmd_agent)


def cmd_agent(args: argparse.Namespace) -> int:
    from edge_agent.memory import limit_arenas

    limit_arenas()  # before torch's and gRPC's threads start (edge_agent/memory.py)
    from edge_agent.agent import EdgeAgent
    from flexfl.plugins import trust_only_plugin_path

    trust_only_plugin_path()  # the coordinator names the dataset and model this device imports and runs

    cfg = load_agent_config(args.config, overrides={
        "coordinator": args.coordinator, "device_id": args.device_id, "fleet_token_file": args.fleet_token_file,
        "announce_departure": False if args.silent else None, "shard_index": args.shard_index,
        "give_up_after_s": args.give_up_after_s,
        "participation": {"trace": args.trace, "no_train": args.no_train},
    })
    buffer = None
    if cfg.send_log:  # the run's folder keeps this agent's log (edge_agent/log_shipping.py)
        from edge_agent.log_shipping import LogBuffer

        buffer = LogBuffer()
        logging.getLogger().addHandler(buffer)
    agent = EdgeAgent(cfg, log_buffer=buffer)

    def on_signal(signum, _frame):
        log.info("%s: received %s", cfg.device_id, signal.Signals(signum).name)
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return agent.run()
