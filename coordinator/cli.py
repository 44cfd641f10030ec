"""`flexfl coordinator`: run the gRPC coordinator from a config file."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

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
    from coordinator.config import load_config
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


def register_live(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("live", help="a live run on this machine: coordinator + N agent processes, "
                                    "one late arrival and one departure")
    p.add_argument("--devices", type=int, default=5, help="number of agents, incl. the late one (default 5)")
    p.add_argument("--dataset", choices=["synthetic", "mnist"], default="synthetic")
    p.add_argument("--iid", action="store_true", help="IID data (default non-IID)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--E", dest="required_updates", type=int, default=20, help="required local updates per round")
    p.add_argument("--deadline-s", type=float, default=2.0)
    p.add_argument("--scheme", choices=["A", "B", "C"], default="C")
    p.add_argument("--departure-policy", choices=["include", "exclude"], default="exclude")
    p.add_argument("--arrive-after", type=int, default=10, help="late device joins after this round (0: none)")
    p.add_argument("--depart-after", type=int, default=20, help="dev-0 leaves after this round (0: none)")
    p.add_argument("--trace-set", default="traces/paper", help="agents cycle through its first traces ('' = none)")
    p.add_argument("--num-traces", type=int, default=5, help="how many of the set's traces to use (default 5)")
    p.add_argument("--eta0", type=float, default=0.0, help="initial learning rate (0: the paper's)")
    p.add_argument("--update-s", type=float, default=0.05,
                   help="emulated device speed: each local update takes at least this long (default 0.05; 0 = full speed)")
    p.add_argument("--total-samples", type=int, default=0)
    p.add_argument("--sizes", choices=["pareto", "equal"], default="equal", help="samples per device (default equal)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/live")
    p.add_argument("--emulate", action="store_true",
                   help="run each agent in an emulated device (needs root): its own network namespace and veth "
                        "link to the coordinator, a tbf upload limit and a cgroup CPU quota (see loadgen/fleet.py); "
                        "pair with --update-s 0 to let the quota alone set the device speed")
    p.add_argument("--emulate-cpu", type=float, default=0.25, help="--emulate: CPUs per device (default 0.25; 0 = no quota)")
    p.add_argument("--emulate-up-kbit", default="0",
                   help="--emulate: upload limit per device in kbit/s, a comma list cycled over devices "
                        "(default 0 = unshaped), e.g. 0,0,20000,5000")
    p.set_defaults(func=cmd_live)


def cmd_live(args: argparse.Namespace) -> int:
    from coordinator.live import LiveConfig, LiveRun
    from flexfl.errors import ConfigError

    try:
        up_kbit = tuple(int(v) for v in args.emulate_up_kbit.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--emulate-up-kbit: expected integers separated by commas, got {args.emulate_up_kbit!r}") from None
    cfg = LiveConfig(
        devices=args.devices, dataset=args.dataset, iid=args.iid, rounds=args.rounds,
        required_updates=args.required_updates, deadline_s=args.deadline_s, scheme=args.scheme,
        departure_policy=args.departure_policy, arrive_after=args.arrive_after, depart_after=args.depart_after,
        trace_set=args.trace_set, num_traces=args.num_traces, eta0=args.eta0, update_s=args.update_s,
        total_samples=args.total_samples, sizes=args.sizes,
        seed=args.seed, out=args.out, emulate=args.emulate, emulate_cpu=args.emulate_cpu, emulate_up_kbit=up_kbit,
    )
    where = "emulated devices (netns + tbf + cgroup quota)" if cfg.emulate else "loopback"
    print(f"flexfl live: {cfg.devices} agents on {where}, {cfg.dataset}, {cfg.rounds} rounds, E={cfg.required_updates}, "
          f"deadline {cfg.deadline_s:g} s, Scheme {cfg.scheme}; arrival after round {cfg.arrive_after}, "
          f"departure ({cfg.departure_policy}) after round {cfg.depart_after}", flush=True)
    s = LiveRun(cfg).run()
    print(f"final test accuracy {100 * s['final_acc']:.2f}% after {s['rounds']} rounds ({s['wall_s']:.0f} s); "
          f"arrival handled at round {s['arrival_round']}, departure at round {s['departure_round']}; "
          f"results in {cfg.out}/ (coordinator/metrics.jsonl, accuracy.png, summary.json, *.log)")
    return 0
