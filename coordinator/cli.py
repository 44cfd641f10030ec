"""`flexfl coordinator`: run the gRPC coordinator from a config file; `flexfl token`: make a fleet token."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from flexfl.config import enum_choices, flag_dest
from flexfl.vocabulary import ClientSampling, DeparturePolicy, Sampling, Scheme, SRule, Unit
from workloads.defaults import DEFAULTS, default_eta0

log = logging.getLogger(__name__)


def add_rules_flags(p: argparse.ArgumentParser, *, table: tuple[str, ...] = ("rules",), scheme: bool = True,
                    eta0_defaults: Mapping[str, float] | None = None) -> None:
    """The flags that override a config's [rules] table (coordinator.rules.config.RulesConfig).

    scheme=False leaves out --scheme (for commands that run several schemes); `eta0_defaults`
    is the command's eta_0 per dataset for the help, when it is not the paper's (DEFAULTS)."""

    def dest(key: str) -> str:
        return flag_dest(*table, key)

    from coordinator.rules.strategies import strategy_names
    from flexfl.plugins import STRATEGY, PluginChoices

    eta0 = {str(ds): default_eta0(ds, "step") for ds in DEFAULTS} | dict(eta0_defaults or {})
    in_epochs = ", ".join(f"{ds} {default_eta0(ds, 'epoch'):g}" for ds in DEFAULTS)
    g = p.add_argument_group("rules ([rules] table)")
    if scheme:
        agg = g.add_mutually_exclusive_group()
        agg.add_argument("--strategy", dest=dest("strategy"), choices=PluginChoices(strategy_names(), STRATEGY),
                         help="aggregation strategy, or a plug-in: MODULE:CLASS, or an installed flexfl.strategies "
                              "entry point (default scheme-c)")
        agg.add_argument("--scheme", dest=dest("scheme"), choices=enum_choices(Scheme),
                         help="aggregation scheme of the paper, the same as --strategy scheme-a|b|c (default C)")
    g.add_argument("--mu", dest=dest("mu"), type=float,
                   help=f"{'--strategy' if scheme else '--scheme'} fedprox: mu of the proximal term "
                        "mu/2 ||w - w_G||^2 (required there)")
    g.add_argument("--E", dest=dest("required_updates"), type=int, help="required local updates per round (default 20)")
    per_dataset = ", ".join(f"{dataset} {value:g}" for dataset, value in eta0.items())
    g.add_argument("--eta0", dest=dest("eta0"), type=float,
                   help=f"initial learning rate eta_0 (default with E in steps: {per_dataset}; in epochs: {in_epochs})")
    g.add_argument("--batch-size", dest=dest("batch_size"), type=int, help="minibatch size (default: the paper's)")
    g.add_argument("--unit", dest=dest("unit"), choices=enum_choices(Unit),
                   help="one local update = one SGD step (default) or one pass over the device's data")
    fr = g.add_mutually_exclusive_group()
    fr.add_argument("--fast-reboot", dest=dest("fast_reboot"), action="store_true", default=None,
                    help="boost an arriving device's weight (default on)")
    fr.add_argument("--no-fast-reboot", dest=dest("fast_reboot"), action="store_false", help="no boost on arrival")
    g.add_argument("--boost", dest=dest("fast_reboot_boost"), type=float,
                   help="fast-reboot boost at arrival (default 3)")
    g.add_argument("--departure-policy", dest=dest("departure_policy"),
                   choices=enum_choices(DeparturePolicy),
                   help="what a departure does to the objective (default exclude); auto and threshold decide "
                        "include or exclude per departure")
    g.add_argument("--auto-c", dest=dest("auto_c"), type=float,
                   help="auto: exclude when T - tau_0 >= c sqrt(Gamma_l tau_0) (default: chosen on Table 5)")
    g.add_argument("--threshold-k", dest=dest("threshold_k"), type=float,
                   help="threshold: exclude when T - tau_0 >= k rounds (default: chosen on Table 5)")
    g.add_argument("--sampling", dest=dest("trace_sampling"), choices=enum_choices(Sampling),
                   help="s per round: drawn i.i.d. from the device's trace (default) or in order")
    g.add_argument("--s-rule", dest=dest("s_rule"), choices=enum_choices(SRule),
                   help="trace fraction -> s (default round)")
    g.add_argument("--sample-k", dest=dest("sample_k"), type=int, metavar="K",
                   help="client sampling: K of the available devices train each round, drawn from the run's seed "
                        "(default: every one; K above the available count: every one)")
    g.add_argument("--client-sampling", dest=dest("client_sampling"), choices=enum_choices(ClientSampling),
                   help="with --sample-k: K distinct devices uniformly (default), or K draws in proportion to p_k "
                        "with replacement; weights expand so the aggregate stays unbiased")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("coordinator", help="run the federated-learning coordinator (gRPC server)",
                       description="Run the coordinator: a gRPC server that devices (`flexfl agent`) join; it runs "
                                   "the rounds with a deadline, aggregates what arrives under the [rules], and writes "
                                   "metrics and a checkpoint per round to the output folder. Settings: the --config "
                                   "file (coordinator/example.toml), then these flags.")
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML config (see coordinator/example.toml)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in the output folder")
    p.add_argument("--resume-if-present", action="store_true",
                   help="continue from the output folder's checkpoint when it has one, else start (for a service "
                        "that restarts the coordinator after a crash)")
    p.add_argument("--allow-rule-change", action="store_true",
                   help="--resume under rules that differ from the checkpoint's (E, eta0, strategy, ...): without it "
                        "such a resume is refused; with it the first row after the resume records what changed")
    p.add_argument("--fresh", action="store_true",
                   help="start over in an output folder that holds an earlier run: it is moved to "
                        "<folder>.previous-<time> first (without --resume or --fresh such a folder is refused)")
    p.add_argument("--listen", dest=flag_dest("server", "listen"), metavar="HOST:PORT",
                   help="address to bind (overrides server.listen)")
    p.add_argument("--rounds", dest=flag_dest("run", "rounds"), type=int, help="overrides run.rounds")
    p.add_argument("--deadline-s", dest=flag_dest("run", "deadline_s"), type=float, help="overrides run.deadline_s")
    p.add_argument("--out", dest=flag_dest("output", "dir"), metavar="DIR", help="overrides output.dir")
    add_rules_flags(p)
    p.set_defaults(func=cmd_coordinator)

    t = sub.add_parser("token", help="write a new random fleet token (the shared secret every device presents)",
                       description="Write a new random fleet token to a file. The coordinator "
                                   "(server.fleet_token_file) and every agent (--token-file) read the same file; "
                                   "the coordinator refuses devices that present another.")
    t.add_argument("--out", type=Path, required=True, metavar="FILE",
                   help="file to write (mode 0600); refused if it exists")
    t.add_argument("--force", action="store_true", help="overwrite an existing file")
    t.set_defaults(func=cmd_token)


def cmd_coordinator(args: argparse.Namespace) -> int:
    from coordinator.config import load_coordinator_config
    from coordinator.resume import CHECKPOINT_NAME
    from coordinator.runtime import Coordinator
    from flexfl.config import overrides_from_args

    cfg = load_coordinator_config(args.config, overrides=overrides_from_args(args))
    resume = args.resume or (args.resume_if_present and (Path(cfg.output.dir) / CHECKPOINT_NAME).exists())
    coord = Coordinator(cfg, resume=resume, fresh=args.fresh, allow_rule_change=args.allow_rule_change)

    def on_signal(signum, _frame):
        log.info("received %s: stopping after writing a checkpoint", signal.Signals(signum).name)
        coord.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    coord.start()
    print(f"coordinator listening on port {coord.port}; output in {coord.engine.out_dir}", flush=True)
    coord.wait()
    rounds = coord.engine.completed_round
    print(f"coordinator stopped after round {rounds}; checkpoint {coord.engine.checkpoint_path}, "
          f"metrics {coord.engine.metrics.path}", flush=True)
    if coord.engine.ended_empty:
        print(f"flexfl coordinator: every device departed before round {rounds + 1} and run.on_empty = stop: "
              "the run ended early; --resume continues it once devices join", file=sys.stderr, flush=True)
        return 3
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    import secrets

    from flexfl.errors import ConfigError
    from flexfl.files import atomic_file

    # A secret goes where the user points, never into folders made up on the way (a typo would hide it).
    folder = args.out.parent
    if not folder.exists():
        raise ConfigError(f"--out {args.out}: the folder {folder} does not exist; create it first")
    if not folder.is_dir():
        raise ConfigError(f"--out {args.out}: {folder} is not a folder")
    if args.out.exists() and not args.force:
        raise ConfigError(f"{args.out} exists; pass --force to replace the fleet token "
                          "(every device then needs the new one)")
    with atomic_file(args.out, perms=0o600) as f:
        f.write(secrets.token_hex(32) + "\n")
    print(f"wrote a new fleet token to {args.out} (mode 0600); give the same file to the coordinator "
          "(server.fleet_token_file) and every agent (fleet_token_file)")
    return 0
