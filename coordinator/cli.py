"""`flexfl coordinator`: run the gRPC coordinator from a config file."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from coordinator.config import load_config

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("coordinator", help="run the federated-learning coordinator (gRPC server)")
    p.add_argument("--config", type=Path, help="TOML config (see coordinator/example.toml)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in the output folder")
    p.add_argument("--listen", help="host:port to bind (overrides server.listen)")
    p.add_argument("--rounds", type=int, help="overrides training.rounds")
    p.add_argument("--scheme", choices=["A", "B", "C"], help="overrides training.scheme")
    p.add_argument("--deadline-s", type=float, dest="deadline_s", help="overrides training.deadline_s")
    p.add_argument("--out", help="overrides output.dir")
    p.set_defaults(func=cmd_coordinator)


def cmd_coordinator(args: argparse.Namespace) -> int:
    from coordinator.runtime import Coordinator

    cfg = load_config(args.config, overrides={
        "server": {"listen": args.listen},
        "training": {"rounds": args.rounds, "scheme": args.scheme, "deadline_s": args.deadline_s},
        "output": {"dir": args.out},
    })
    coord = Coordinator(cfg, resume=args.resume)
    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info("received %s: stopping after writing a checkpoint", signal.Signals(signum).name)
        stop.set()
        coord.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    coord.start()
    print(f"coordinator listening on port {coord.port}; output in {coord.engine.out_dir}", flush=True)
    coord.wait()
    rounds = coord.engine.completed_round
    print(f"coordinator stopped after round {rounds}; checkpoint {coord.engine.checkpoint_path}, "
          f"metrics {coord.engine.metrics.path}", flush=True)
    return 0
