"""`flexfl live`: the command (flexfl/app/live.py holds the run; this module stays light to import)."""

from __future__ import annotations

import argparse
from pathlib import Path

from flexfl.config import flag_dest


def register(sub: argparse._SubParsersAction) -> None:
    from coordinator.cli import add_rules_flags
    from workloads.cli import add_partition_flags
    from workloads.defaults import EMULATED_DEFAULTS, LIVE_DEFAULTS

    def toml(value: object) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    own = "; ".join(f"{dataset}: " + ", ".join(f"{table}.{key} = {toml(value)}" for table, values in tables.items()
                                               for key, value in values.items())
                    for dataset, tables in LIVE_DEFAULTS.items())
    emulated = ", ".join(f"{key} = {toml(value) or repr(value)}" for key, value in _flat(EMULATED_DEFAULTS))
    p = sub.add_parser("live", help="a live run on this machine: coordinator + N agent processes, "
                                    "one late arrival and one departure",
                       description=f"A live run on this machine. Its own defaults, below --config and the flags: "
                                   f"{own} (the paper's MNIST settings do not train in a live run's rounds; the "
                                   "reason is at LIVE_DEFAULTS in workloads/defaults.py); with --emulate: "
                                   f"{emulated} (deadline mode: each agent trains until its own deadline budget "
                                   "runs out, so its CPU quota and upload rate decide s; --trace-set traces/paper "
                                   "makes the emulated agents follow traces again).")
    p.add_argument("--config", type=Path, help="TOML file with LiveConfig fields (flags override it)")
    add_partition_flags(p)
    live_eta0 = {str(ds): t["rules"]["eta0"] for ds, t in LIVE_DEFAULTS.items() if "eta0" in t.get("rules", {})}
    add_rules_flags(p, eta0_defaults=live_eta0)
    p.add_argument("--rounds", dest=flag_dest("run", "rounds"), type=int, help="rounds (default 30)")
    p.add_argument("--deadline-s", dest=flag_dest("run", "deadline_s"), type=float,
                   help="per-round deadline (default 2)")
    p.add_argument("--arrive-round", dest=flag_dest("arrive_round"), type=int, metavar="R",
                   help="the last device arrives during round R and trains from R+1 (default rounds/3; 0: none)")
    p.add_argument("--depart-round", dest=flag_dest("depart_round"), type=int, metavar="R",
                   help="dev-0 trains in round R and leaves at its close (default 2*rounds/3; 0: none)")
    p.add_argument("--trace-set", dest=flag_dest("traces", "set"), help="agents follow its traces ('' = none; "
                   "default traces/paper on loopback, none with --emulate)")
    p.add_argument("--num-traces", dest=flag_dest("traces", "num_traces"), type=int,
                   help="|T|: traces used (default 5)")
    p.add_argument("--update-s", dest=flag_dest("update_s"), type=float,
                   help="emulated device speed: each local update takes at least this long "
                        "(default 0.05 on loopback, 0 = full speed with --emulate)")
    p.add_argument("--seed", dest=flag_dest("run", "seed"), type=int,
                   help="model, minibatch and trace seed (default 0)")
    p.add_argument("--out", dest=flag_dest("out"), help="results folder (default out/live)")
    p.add_argument("--fresh", action="store_true",
                   help="the results folder holds an earlier run: move it to <folder>.previous-<time> first "
                        "(without --fresh or --resume such a folder is refused)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --out (default out/live) from its coordinator's checkpoint, "
                        "with the config it saved there (live.toml); flags that would change it are refused")
    p.add_argument("--fleet", dest=flag_dest("fleet"), metavar="FILE",
                   help="run only the coordinator here, for devices whose agents run as services elsewhere (Pis "
                        "provisioned with serve_runs) and dial it: a fleet file names them, the coordinator's "
                        "[server] (listen address, fleet token, TLS) and how to watch it (docs/campaigns.md)")
    p.add_argument("--emulate", dest=flag_dest("emulate", "enabled"), action="store_true", default=None,
                   help="run each agent in an emulated device (needs root): its own network namespace and veth "
                        "link to the coordinator, a tbf upload limit and a cgroup CPU quota (see loadgen/fleet.py); "
                        "agents follow no trace and pad no update unless asked (--trace-set, --update-s), so the "
                        "quota and the upload rate decide s, and each round line says why a device stopped short "
                        "of E: compute, upload, missed (nothing arrived in time), offline, ...")
    p.add_argument("--emulate-cpu", dest=flag_dest("emulate", "cpu"), type=_float_list,
                   help="--emulate: CPUs per device, a comma list cycled over devices (default 0.25; 0 = no quota)")
    p.add_argument("--emulate-up-kbit", dest=flag_dest("emulate", "up_kbit"), type=_int_list,
                   help="--emulate: upload limit per device in kbit/s, a comma list cycled over devices "
                        "(default 0 = unshaped), e.g. 0,0,20000,5000")
    p.add_argument("--timeline", dest=flag_dest("emulate", "timeline"), metavar="FILE",
                   help="--emulate: devices dev-0..dev-N-1 follow this device timeline (traces/README.md, "
                        "\"Device timelines\"; the file `flexfl sim run --timeline` reads): each one's CPU quota "
                        "(cpu_share x its --emulate-cpu), upload and download rate (tc tbf) and link (down when "
                        "offline), round by round from round 1's opening, or by seconds from it; the applied "
                        "conditions go to <out>/conditions.jsonl and the report")
    p.set_defaults(func=cmd_live)


def _flat(tables: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(table.key, value) of nested {table: {key: value}}: the defaults for the help, a config's keys by name."""
    return [pair for key, value in tables.items()
            for pair in (_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [(prefix + key, value)])]


def _float_list(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None


def banner(cfg) -> str:
    """The run's first line: where, what data, which rules, and the scripted events (the README quotes it)."""
    from flexfl.text import count
    from workloads.partition_spec import device_id

    where = "emulated devices (netns + tbf + cgroup quota)" if cfg.emulate.enabled else "loopback"
    if cfg.emulate.timeline:
        where += f" following the timeline {cfg.emulate.timeline}"
    r = cfg.rules
    events = []
    if cfg.arrival:
        events.append(f"{device_id(cfg.devices - 1)} arrives in round {cfg.arrival}"
                      f"{' with fast-reboot' if r.fast_reboot else ' (fast-reboot off)'}")
    if cfg.departure:
        events.append(f"dev-0 departs after round {cfg.departure} ({r.departure_policy})")
    return (f"flexfl live: {count(cfg.devices, 'agent')} on {where}, {cfg.partition.describe()}, {cfg.rounds} rounds, "
            f"E={r.required_updates}, eta0={r.eta0_for(cfg.partition.dataset):g}, deadline {cfg.deadline_s:g} s, "
            f"{r.aggregation.description}; {'; '.join(events) or 'no arrival or departure'}")


def check_before_claim(cfg) -> None:
    """Fail now on what would fail the run's start-up, before it claims and writes its folder.

    A run that failed after the claim left its configs, a log and the token behind, and the
    retry was refused as "an earlier run" (issue 33). Checked: the data the coordinator loads
    (the dataset is present and splits as asked), the model (a plug-in's too), the configs
    the run writes (trace set included: written to a scratch folder, which is dropped), the
    address the coordinator binds, and root for an emulated fleet.
    """
    import tempfile

    from flexfl.app.live import write_configs
    from flexfl.errors import ConfigError
    from loadgen.harness import free_port
    from workloads.federated import initial_model, load_evaluation, model_spec

    load_evaluation(cfg.partition)  # the coordinator's view of the data, as it will load it
    initial_model(model_spec(cfg.partition.dataset, model=cfg.rules.model), seed=0)
    if cfg.emulate.enabled:
        from loadgen.fleet import require_root

        require_root("flexfl live --emulate")
        host = "127.0.0.1"  # the fleet's address is known once it is up; the configs need some address
    else:
        host = cfg.host
    fleet = cfg.fleet_file()  # its devices' agents dial its [server] listen address: no port to pick
    try:
        address = fleet.watch_address if fleet is not None else f"{host}:{free_port(host)}"
    except OSError as exc:
        raise ConfigError(f"flexfl live: the coordinator cannot listen on {host}: {exc.strerror or exc}") from None
    with tempfile.TemporaryDirectory(prefix="flexfl-live-check-") as scratch:
        run = Path(scratch) / "run"  # a folder in the scratch one: the run's secrets folder goes beside it
        run.mkdir()
        write_configs(cfg, run, address, fleet)


def resumed_config(args: argparse.Namespace, overrides: dict):
    """The config an interrupted run saved in its folder (--out, default out/live): flags may repeat it, not change
    it."""
    from flexfl.app.live import CONFIG_NAME, LiveConfig, load_live_config
    from flexfl.config import to_dict
    from flexfl.errors import ConfigError

    if args.config is not None:
        raise ConfigError(f"--resume continues a run with the config it saved ({CONFIG_NAME} in its folder): "
                          f"drop --config {args.config}")
    out = Path(overrides.get("out") or LiveConfig().out)
    saved_path = out / CONFIG_NAME
    if not saved_path.exists():
        raise ConfigError(f"--resume: {out} holds no {CONFIG_NAME} (no flexfl live run started there"
                          f"{'' if out.exists() else ': the folder does not exist'}); --out names the run's folder")
    saved = load_live_config(saved_path)
    cfg = load_live_config(saved_path, overrides=overrides)
    before, after = dict(_flat(to_dict(saved, absolute_paths=True))), dict(_flat(to_dict(cfg, absolute_paths=True)))
    changed = [f"{key}: {before.get(key)!r} -> {after.get(key)!r}" for key in sorted(set(before) | set(after))
               if key != "out" and before.get(key) != after.get(key)]
    if changed:
        raise ConfigError(f"--resume continues {out} as it was configured ({saved_path}); these flags change it: "
                          + "; ".join(changed))
    return cfg


def cmd_live(args: argparse.Namespace) -> int:
    from flexfl.app.live import LiveRun, load_live_config
    from flexfl.config import overrides_from_args

    overrides = overrides_from_args(args)
    cfg = resumed_config(args, overrides) if args.resume else load_live_config(args.config, overrides=overrides)
    print(banner(cfg), flush=True)
    check_before_claim(cfg)
    s = LiveRun(cfg, fresh=args.fresh, resume=args.resume).run()
    happened = []
    if s["arrival_round"] is not None:
        happened.append(f"arrival took effect at round {s['arrival_round']} (asked {s['arrival_asked']})")
    if s["departure_round"] is not None:
        happened.append(f"departure at round {s['departure_round']} (asked {s['departure_asked']})")
    print(f"final test accuracy {100 * s['final_acc']:.2f}% under {cfg.rules.aggregation.description} after "
          f"{s['rounds']} of {cfg.rounds} rounds ({s['wall_s']:.0f} s"
          f"{f', resumed after round {r}' if (r := s['resumed_after_round']) else ''}); "
          f"{'; '.join(happened) or 'no membership events'}; results in {cfg.out}/ "
          f"(coordinator/metrics.jsonl, accuracy.png, summary.json, *.log)")
    timeline = s.get("timeline") or {}
    cost, round_s = timeline.get("at_share_1"), timeline.get("round_s")
    if cost:
        from simulator.timeline_source import TimelineRun, sim_run_argv, sim_run_hint

        # A timeline in seconds is read at each round's start: the simulator needs the live rounds' pace too.
        pace = float(f"{round_s:.3g}") if round_s and timeline.get("unit") == "s" else None
        run = TimelineRun(path=str(cfg.emulate.timeline), deadline_s=cfg.deadline_s,
                          update_s=float(f"{cost['update_s']:.3g}"), round_s=pace)
        argv = sim_run_argv(partition=cfg.partition, rules=cfg.rules, rounds=cfg.rounds, seed=cfg.seed, run=run,
                            arrivals=[(cfg.devices - 1, cfg.arrival)] if cfg.arrival else [],
                            departures=[(0, cfg.departure)] if cfg.departure else [])
        print(sim_run_hint(argv, update_s=cost["update_s"], device_rounds=cost["device_rounds"]))
    from flexfl.app.report import report_line

    print(report_line(Path(cfg.out)))
    if s["problems"]:
        from flexfl.app.live import LiveRunError

        raise LiveRunError("; ".join(s["problems"]))
    return 0
