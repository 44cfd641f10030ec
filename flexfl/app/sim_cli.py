"""`flexfl sim ...`: single simulation runs and the paper's scheme comparison."""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexfl.config import enum_choices, flag_dest
from flexfl.errors import ConfigError
from flexfl.files import atomic_file
from flexfl.vocabulary import DeparturePolicy, Scheme, Unit
from simulator.paper_numbers import DEFAULT_PARTITION, PAPER_DEVICES, SETTINGS, SWEEP_DATASETS
from simulator.trainers.trainer_kind import TrainerKind

if TYPE_CHECKING:
    from simulator.timeline_source import TimelineRun
    from workloads.partition_spec import PartitionSpec

# Simulation modules (torch, the trainers) are imported by the handlers, so that building
# the `flexfl` parser stays light for the edge agent.

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("sim", help="simulate federated training over participation traces")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")
    _register_run(sim_sub)
    _register_schemes(sim_sub)
    _register_tables(sim_sub)
    _register_protocols(sim_sub)
    _register_figure(sim_sub)


def _register_run(sim_sub: argparse._SubParsersAction) -> None:
    from coordinator.rules.strategies import strategy_names

    run = sim_sub.add_parser("run", help="one simulated run per scheme or strategy on the same data and traces")
    _add_config_flags(run, partition=DEFAULT_PARTITION)
    run.add_argument("--scheme", "--strategy", dest="schemes", action="append", choices=run_choices(), metavar="NAME",
                     help="a scheme (A, B, C) or strategy (" + ", ".join(strategy_names(asynchronous=True)) +
                          ", or a plug-in: "
                          "MODULE:CLASS) to run, repeatable (default: the strategy the --config file's [rules] "
                          "names, else A, B and C); each run's strategy, whatever [rules] says")
    # The old spelling, kept working for scripts: --schemes B,C is --scheme B --scheme C.
    run.add_argument("--schemes", dest="schemes_list", help=argparse.SUPPRESS)
    run.add_argument("--out", type=Path, default=Path("out/sim"), help="results folder (default out/sim)")
    run.add_argument("--fresh", action="store_true",
                     help="if --out holds an earlier run, move it aside to <out>.previous-<time> (nothing is deleted) "
                          "and start a new one; without it such a folder is refused")
    run.add_argument("--progress-every", type=int, default=0, help="print progress every N rounds (default: rounds/10)")
    _add_timeline_flags(run)
    _add_fedbuff_flags(run)
    run.set_defaults(func=cmd_run)


# FedBuff's parameters as flags (coordinator.rules.strategies.FedBuff): flag -> (its field, argparse keywords)
FEDBUFF_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--buffer": ("buffer", {"type": int, "metavar": "K", "help": "updates per server step (default 10)"}),
    "--staleness": ("staleness", {"help": "staleness weight: sqrt, 1/sqrt(1 + t), or constant, 1 (default sqrt)"}),
    "--server-lr": ("server_lr", {"type": float, "help": "server learning rate (default 1)"}),
    "--concurrency": ("concurrency", {"type": int, "help": "devices training at once (default 0: all)"}),
    "--budget": ("budget", {"action": "store_const", "const": True,
                            "help": "a task ends at the deadline with the deadline rule's s (default: E updates)"}),
    "--es-factor": ("es_factor", {"action": "store_const", "const": True,
                                  "help": "weigh an update of s < E updates by E / s (Scheme C's factor)"}),
}


def _add_fedbuff_flags(p: argparse.ArgumentParser) -> None:
    from coordinator.rules.strategies import Staleness

    g = p.add_argument_group("FedBuff (--scheme fedbuff: asynchronous, on the simulated clock; simulator/async_run.py)")
    for flag, (name, kwargs) in FEDBUFF_FLAGS.items():
        options: dict[str, Any] = {**kwargs, **({"choices": enum_choices(Staleness)} if name == "staleness" else {})}
        g.add_argument(flag, dest=f"fedbuff_{name}", **options)


def _fedbuff_params(args: argparse.Namespace) -> dict[str, Any]:
    """The FedBuff flags given, as [rules.strategy] parameters."""
    return {name: getattr(args, f"fedbuff_{name}") for name, _ in FEDBUFF_FLAGS.values()
            if getattr(args, f"fedbuff_{name}", None) is not None}


def _register_schemes(sim_sub: argparse._SubParsersAction) -> None:
    cmp_ = sim_sub.add_parser("schemes", help="the paper's Table 3: Schemes A/B/C over |T| = 1..8, IID and non-IID")
    _add_config_flags(cmp_)
    cmp_.add_argument("--settings", default="iid,niid", help="comma-separated: iid, niid (default both)")
    cmp_.add_argument("--num-traces-list", default="1-8", help="|T| values, e.g. 1-8 or 1,3,5,8 (default 1-8)")
    cmp_.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    add_sweep_flags(cmp_)
    cmp_.add_argument("--work-dir", type=Path, default=None,
                      help="per-run CSV/JSON files, reused when rerun (default <out>/runs/schemes_<dataset>)")
    cmp_.add_argument("--out", type=Path, default=Path("results"),
                      help="where the table, CSVs and plots go (default results)")
    cmp_.add_argument("--report-only", action="store_true",
                      help="write the table from the runs already in the work folder; compute nothing")
    cmp_.add_argument("--note", default="",
                      help="a paragraph for the table file (e.g. why a setting differs from the paper)")
    _add_replace_page_flag(cmp_, "schemes_<dataset>_final.csv")
    cmp_.set_defaults(func=cmd_schemes)


def _register_tables(sim_sub: argparse._SubParsersAction) -> None:
    """The paper's Tables 3, 4 and 5."""
    t3 = sim_sub.add_parser("table3", help="Table 3 under several readings of the paper's setup (sensitivity study)")
    t3.add_argument("--dataset", choices=enum_choices(SWEEP_DATASETS), default="synthetic")
    t3.add_argument("--readings", default="all", help="comma-separated readings, or all (see results/table3.md)")
    t3.add_argument("--num-traces-list", default="1-8", help="|T| values (default 1-8)")
    t3.add_argument("--settings", default="iid,niid", help="comma-separated, in the order to run: iid, niid "
                    "(default iid,niid)")
    _add_sweep_flags(t3, seeds="0-4")
    _add_replace_page_flag(t3, "table3_runs.csv")
    t3.set_defaults(func=cmd_table3)

    t4 = sim_sub.add_parser("table4", help="Table 4: rounds to recover after an arrival, fast-reboot vs vanilla")
    t4.add_argument("--datasets", default=",".join(enum_choices(SWEEP_DATASETS)),
                    help=f"comma-separated: {', '.join(enum_choices(SWEEP_DATASETS))}")
    _add_sweep_flags(t4, seeds="0-4")
    _add_replace_page_flag(t4, "table4_runs.csv")
    t4.set_defaults(func=cmd_table4)

    t5 = sim_sub.add_parser("table5", help="Table 5: include/exclude crossing after a departure, and the auto rule")
    _add_sweep_flags(t5, seeds="0-4")
    _add_replace_page_flag(t5, "table5_runs.csv")
    t5.set_defaults(func=cmd_table5)


def _register_protocols(sim_sub: argparse._SubParsersAction) -> None:
    """The operating-point protocol and the strategies page."""
    op = sim_sub.add_parser("operating-point",
                            help="the operating-point protocol: eta_0 for a dataset and E's unit, "
                                 "chosen on full-participation FedAvg (simulator/paper/operating_point.py)")
    op.add_argument("--dataset", choices=enum_choices(SWEEP_DATASETS), required=True)
    op.add_argument("--unit", choices=enum_choices(Unit), required=True, help="what one of the E = 20 updates is")
    add_sweep_flags(op)
    op.add_argument("--out", type=Path, default=Path("results"),
                    help="where operating_point.md/.toml/_runs.csv go (default results)")
    op.add_argument("--work-dir", type=Path, default=None,
                    help="per-run files, reused when rerun (default <out>/runs/operating_point_<dataset>)")
    _add_replace_page_flag(op, "operating_point_runs.csv")
    op.set_defaults(func=cmd_operating_point)

    strat = sim_sub.add_parser("strategies", help="Schemes A/B/C, FedNova, FedProx (mu by protocol) and MIFA on the "
                               "paper's traces: one section of results/strategies.md "
                               "(simulator/paper/strategies_page.py)")
    strat.add_argument("--dataset", choices=enum_choices(SWEEP_DATASETS), required=True)
    strat.add_argument("--num-traces-list", default="2,5,8", help="|T| values (default 2,5,8)")
    strat.add_argument("--settings", default="iid,niid", help="comma-separated, in the order to run: iid, niid "
                       "(default iid,niid)")
    strat.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 or 0,2 (default 0-4)")
    add_sweep_flags(strat)
    from simulator.paper.regime import add_regime_flags

    add_regime_flags(strat, unit="epoch", eta0="protocol")
    strat.add_argument("--out", type=Path, default=Path("results"),
                       help="where strategies.md and its files go, every section's runs under <out>/runs/ "
                            "(default results)")
    strat.add_argument("--report-only", action="store_true",
                       help="write the page from finished runs; compute nothing")
    _add_replace_page_flag(strat, "strategies_runs.csv")
    strat.set_defaults(func=cmd_strategies)


def _register_figure(sim_sub: argparse._SubParsersAction) -> None:
    fig = sim_sub.add_parser("arrivals-figure", help="the multi-arrival figure: 7 devices, then 3 arrivals")
    _add_sweep_flags(fig, seeds="0-4")
    fig.add_argument("--dataset", choices=enum_choices(SWEEP_DATASETS), default="mnist",
                     help="non-IID MNIST (the paper's) or SYNTHETIC(1,1) (default mnist)")
    _add_replace_page_flag(fig, "figure_arrivals[_<dataset>]_runs.csv")
    fig.set_defaults(func=cmd_arrivals_figure)


def _add_timeline_flags(p: argparse.ArgumentParser) -> None:
    """--timeline and the cost model that turns its conditions into s (simulator.timeline_source)."""
    g = p.add_argument_group("device timeline (instead of a trace set; simulator/timeline_source.py)")
    g.add_argument("--timeline", type=Path, metavar="FILE",
                   help="devices dev-0..dev-N-1 take s from this timeline (traces/README.md) by the agent's deadline "
                        "rule, not from a trace set")
    g.add_argument("--deadline-s", type=float,
                   help="with --timeline: the round deadline, seconds (required); with a trace set: the deadline its "
                        "fractions were completed in, for the simulated clock (rows' clock_s; default: a recorded "
                        "set's own; [clock] deadline_s; simulator/clock.py)")
    g.add_argument("--update-s", type=float, help="with --timeline: one local update at cpu_share 1, seconds")
    g.add_argument("--sample-s", type=float,
                   help="with --timeline, instead of --update-s: one training sample at cpu_share 1, seconds "
                        "(x batch size, or x n_k with --unit epoch)")
    g.add_argument("--round-s", type=float,
                   help="with a timeline in seconds: seconds from one round's start to the next "
                        "(default: the deadline)")
    g.add_argument("--wait-all", action="store_true",
                   help="rounds without a deadline (FedAvg waiting for everyone): every participant that can work "
                        "does all E updates and a round lasts until the last one arrives, on the simulated clock "
                        "([clock] wait_all; simulator/participation.py WaitForAll)")
    g.add_argument("--until-s", type=float, metavar="SECONDS",
                   help="end the run at its first round (or FedBuff server step) closing at or after this simulated "
                        "second; --rounds stays the cap ([clock] until_s)")


def _timeline_run(args: argparse.Namespace) -> TimelineRun | None:
    """The TimelineRun that --timeline and its flags describe, or None without --timeline."""
    flags = {name: getattr(args, name, None) for name in ("deadline_s", "update_s", "sample_s", "round_s")}
    if getattr(args, "timeline", None) is None:  # --deadline-s alone is the trace set's clock (cmd_run)
        given = [f"--{name.replace('_', '-')}" for name, value in flags.items()
                 if value is not None and name != "deadline_s"]
        if given:
            raise ConfigError(f"{', '.join(given)} only apply with --timeline FILE")
        return None
    if getattr(args, flag_dest("traces", "set"), None) or getattr(args, flag_dest("traces", "num_traces"), None):
        raise ConfigError("--timeline replaces the trace set: drop --trace-set / --num-traces")
    if flags["deadline_s"] is None:
        raise ConfigError("--timeline needs --deadline-s SECONDS (the round deadline its devices race)")
    from simulator.timeline_source import TimelineRun

    return TimelineRun(path=str(args.timeline), deadline_s=flags["deadline_s"], update_s=flags["update_s"],
                       sample_s=flags["sample_s"], round_s=flags["round_s"])


def _add_replace_page_flag(p: argparse.ArgumentParser, runs_csv: str) -> None:
    p.add_argument("--replace-page", action="store_true",
                   help=f"write the page even if its committed {runs_csv} lists runs not finished here "
                        "(default: the page then goes to <out>/local)")


def add_sweep_flags(p: argparse.ArgumentParser) -> None:
    """--jobs and --ray-address: where a sweep's groups run (simulator.executors.executor_for)."""
    p.add_argument("--jobs", type=int, default=None,
                   help="local worker processes, one torch thread each (default: one per CPU; 1 = in this process); "
                        "with --ray-address local, the CPUs of the fresh Ray instance")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="run the groups as Ray tasks: a cluster (host:6379, ray://host:10001, auto) or 'local' for a "
                        "fresh local Ray instance (default: $RAY_ADDRESS if set, else local processes; "
                        "needs pip install -e '.[cluster]')")


def _add_sweep_flags(p: argparse.ArgumentParser, *, seeds: str) -> None:
    p.add_argument("--seeds", default=seeds, help=f"seeds, e.g. 0-4 or 0,2 (default {seeds})")
    p.add_argument("--jobs", type=int, default=None, help="local worker processes (default: one per CPU)")
    p.add_argument("--ray-address", default=None,
                   help="run on a Ray cluster (or 'local'); default: RAY_ADDRESS if set, else local processes")
    p.add_argument("--out", type=Path, default=None,
                   help="where the page and plots go (default results, or results/<unit>-<eta0> for another regime)")
    p.add_argument("--work-dir", type=Path, default=None, help="per-run files, reused when rerun "
                   "(default <out>/runs/<table>_<dataset>)")
    from simulator.paper.regime import add_regime_flags

    add_regime_flags(p)
    p.add_argument("--report-only", action="store_true", help="write the page from finished runs; compute nothing")


def _add_config_flags(p: argparse.ArgumentParser, *, partition: PartitionSpec | None = None) -> None:
    from coordinator.cli import add_rules_flags
    from workloads.cli import add_partition_flags

    p.add_argument("--config", type=Path, help="TOML file with SimConfig tables (flags override it)")
    add_partition_flags(p, defaults=partition)
    add_rules_flags(p, scheme=False)  # run and schemes run several schemes: their own flags say which
    p.add_argument("--rounds", dest=flag_dest("run", "rounds"), type=int, help="rounds (default 200)")
    p.add_argument("--seed", dest=flag_dest("run", "seed"), type=int,
                   help="seed of the model, traces and minibatches, and of the data split unless --data-seed "
                        "(default 0)")
    p.add_argument("--trace-set", dest=flag_dest("traces", "set"), help="trace set folder (default traces/paper)")
    p.add_argument("--num-traces", dest=flag_dest("traces", "num_traces"), type=int,
                   help="|T|: devices draw from the first |T| traces (default 8)")
    p.add_argument("--trainer", dest=flag_dest("trainer"), choices=enum_choices(TrainerKind),
                   help="cache (each device alone in numba kernels, the fastest), fast (all devices together in "
                        "batched torch), plain (edge_agent.trainer per device, the reference), "
                        "or auto (default: cache)")
    p.add_argument("--arrive", action="append", default=[], metavar="K@R",
                   help="device K is absent until it arrives during round R (trains from R+1); repeatable")
    p.add_argument("--depart", action="append", default=[], metavar="K@R[:POLICY]",
                   help=f"device K trains in round R and leaves at its close, under POLICY "
                        f"{'|'.join(enum_choices(DeparturePolicy))} (default --departure-policy); repeatable")


def config_from_args(args: argparse.Namespace, **defaults):
    """Dataclass defaults < `defaults` ({table: {key: value}}) < TOML config file < CLI flags; a SimConfig."""
    from flexfl.config import load_config, overrides_from_args
    from simulator.engine import SimConfig

    flags = overrides_from_args(args)
    seed = flags.get("run", {}).get("seed")
    if seed is not None and "seed" not in flags.get("partition", {}):
        flags.setdefault("partition", {})["seed"] = seed  # one --seed varies the data too
    flags.setdefault("schedule", {}).update(_schedule(args))
    return load_config(SimConfig, args.config, defaults=defaults, overrides=flags)


def _schedule(args: argparse.Namespace) -> dict:
    """--arrive K@R and --depart K@R[:POLICY] as [schedule] tables."""
    def parse(text: str, flag: str) -> tuple[int, int, str | None]:
        where, _, policy = text.partition(":")
        device, _at, round_ = where.partition("@")
        try:
            return int(device), int(round_), policy or None
        except ValueError:
            policies = f"[:{'|'.join(enum_choices(DeparturePolicy))}]" if flag == "--depart" else ""
            raise ConfigError(f"{flag} {text!r}: expected DEVICE@ROUND{policies}, e.g. 3@30") from None

    out: dict = {}
    if getattr(args, "arrive", None):
        out["arrivals"] = [{"device": d, "round": r} for d, r, _ in (parse(t, "--arrive") for t in args.arrive)]
    if getattr(args, "depart", None):
        out["departures"] = [{"device": d, "round": r, **({"policy": p} if p else {})}
                             for d, r, p in (parse(t, "--depart") for t in args.depart)]
    return out


def _parse_ints(text: str, what: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-")
                if int(hi) < int(lo):
                    raise ConfigError(f"{what}: the range {part.strip()!r} runs backwards (write "
                                      f"{hi.strip()}-{lo.strip()})")
                out.extend(range(int(lo), int(hi) + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise ConfigError(f"{what}: expected integers like 1-8 or 1,3,5, got {text!r}") from None
    if not out:
        raise ConfigError(f"{what}: no values in {text!r}")
    return out


def run_choices() -> list[str]:
    """What `sim run --scheme` takes: the paper's scheme letters, every registered strategy's name, and plug-ins."""
    from coordinator.rules.strategies import strategy_names
    from flexfl.plugins import STRATEGY, PluginChoices

    return PluginChoices([*enum_choices(Scheme), *strategy_names(asynchronous=True)], STRATEGY)


def _schemes(args: argparse.Namespace) -> list[str] | None:
    """--scheme NAME (repeatable), or the old --schemes X,Y; neither: None (the config's strategy, or A, B, C)."""
    if args.schemes_list is not None:
        names = [s.strip() for s in args.schemes_list.split(",") if s.strip()]
        log.warning("--schemes is deprecated: write --scheme %s", " --scheme ".join(names))
        return names
    return list(args.schemes) if args.schemes else None


def names_a_strategy(path: Path | None) -> bool:
    """The config file at `path` names its strategy ([rules] scheme, strategy or [rules.strategy])."""
    from flexfl.config import read_toml

    rules = read_toml(path).get("rules") if path is not None else None
    return isinstance(rules, dict) and ("scheme" in rules or "strategy" in rules)


def cmd_run(args: argparse.Namespace) -> int:
    from coordinator.rules.strategies import get_strategy
    from flexfl.config import flag_dest
    from flexfl.vocabulary import Scheme
    from simulator.sim_run import SimRunPlan, simulate

    # --mu is FedProx's: set aside so that the base rules load whatever their strategy, and given to
    # the fedprox run (with_strategy leaves it out of the others).
    mu_flag = flag_dest("rules", "mu")
    mu, args = getattr(args, mu_flag, None), argparse.Namespace(**{**vars(args), mu_flag: None})
    cfg = config_from_args(args)
    # --deadline-s without --timeline is the trace set's clock
    trace_deadline = getattr(args, "deadline_s", None) if getattr(args, "timeline", None) is None else None
    wait_all, until_s = getattr(args, "wait_all", False), getattr(args, "until_s", None)
    if trace_deadline is not None or wait_all or until_s is not None:
        from simulator.clock import ClockConfig

        cfg = replace(cfg, clock=ClockConfig(deadline_s=trace_deadline, wait_all=wait_all, until_s=until_s))
    mu = mu if mu is not None else cfg.rules.aggregation.parameters.get("mu")
    names = _schemes(args)
    if names is None and names_a_strategy(args.config):
        # The file's [rules] strategy (with its parameters) is the one run, as `flexfl live` runs it
        agg = cfg.rules.aggregation
        own = cfg if mu is None else replace(cfg, rules=cfg.rules.with_strategy(agg.name, mu=mu, params=agg.parameters))
        configs = {own.rules.aggregation.label: own}
    else:
        # The paper's schemes by letter (any case, as before) or name, other strategies by name; each
        # named as rounds.csv and the report name it (its label). Every run's config is made (and an
        # unknown name or a missing mu refused) before any run.
        # A plug-in is named by its import path and labelled by its own label (its folder's name).
        chosen = [get_strategy(s.upper() if s.upper() in {v.value for v in Scheme} else s)
                  for s in names or enum_choices(Scheme)]
        buffered = _fedbuff_params(args)
        if buffered and not any(s.name == "fedbuff" for s in chosen):
            raise ConfigError(f"{', '.join(f'--{k.replace(chr(95), chr(45))}' for k in buffered)}: FedBuff's "
                              "parameters; run it with --scheme fedbuff")
        configs = {s.label: replace(cfg, rules=cfg.rules.with_strategy(
            s.name, mu=mu if "mu" in s.parameters else None, params=buffered if s.name == "fedbuff" else None))
                   for s in chosen}
    simulate(SimRunPlan(base=cfg, configs=configs, out=args.out, timeline=_timeline_run(args),
                        progress_every=args.progress_every, fresh=args.fresh))
    from flexfl.app.report import report_line  # the report sits above the simulator (it reads runs of both engines)

    for label, c in configs.items():
        print(f"{c.rules.aggregation.title} {report_line(args.out / label)}")
    return 0


def cmd_schemes(args: argparse.Namespace) -> int:
    from simulator.executors import executor_for
    from simulator.paper.schemes import finished_runs, run_comparison, write_outputs
    from simulator.sweep import mean_run_seconds

    dataset = getattr(args, flag_dest("partition", "dataset")) or "synthetic"
    cfg = config_from_args(args, partition={"dataset": dataset, "n_devices": PAPER_DEVICES[dataset]})
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = set(settings) - set(SETTINGS[dataset])
    if bad:
        raise ConfigError(f"unknown settings {sorted(bad)}; use iid and/or niid")
    num_traces = _parse_ints(args.num_traces_list, "--num-traces-list")
    if not num_traces or min(num_traces) < 1 or max(num_traces) > 8:
        raise ConfigError(f"--num-traces-list must pick values in 1..8, got {num_traces}")
    seeds = _parse_ints(args.seeds, "--seeds")
    work_dir = args.work_dir or args.out / "runs" / f"schemes_{dataset}"
    started = time.perf_counter()
    if args.report_only:
        summaries = finished_runs(cfg, settings=settings, num_traces=num_traces, seeds=seeds, work_dir=work_dir)
        if not summaries:
            raise ConfigError(f"--report-only: no finished runs with this configuration in {work_dir}")
    else:
        summaries = run_comparison(cfg, settings=settings, num_traces=num_traces, seeds=seeds, work_dir=work_dir,
                                   executor=executor_for(jobs=args.jobs, ray_address=args.ray_address))
    paths = write_outputs(dataset, summaries, work_dir=work_dir, out_dir=args.out, settings=settings,
                          replace_page=args.replace_page)
    run_s, per_s = mean_run_seconds(summaries)
    md = Path(paths["dir"]) / f"schemes_{dataset}.md"
    with atomic_file(md) as f:
        f.write(_markdown(dataset, cfg, settings, num_traces, seeds, paths, run_s, per_s, note=args.note,
                          work_dir=work_dir))
    print(f"{len(summaries)} runs in {time.perf_counter() - started:.0f} s; one {cfg.rounds}-round run takes "
          f"{run_s:.1f} s on average ({per_s:.0f} device-updates/s); table in {md}")
    return 0


def _markdown(dataset, cfg, settings, num_traces, seeds, paths, run_s, per_s, *, note: str = "", work_dir: Path) -> str:
    plots = "\n".join(f"![{k}]({Path(v).name})" for k, v in paths.items() if k.startswith("plot_"))
    r, ds = cfg.rules, cfg.partition.dataset
    n_devices, final_csv, work_name = cfg.partition.n_devices, Path(paths["final_csv"]).name, Path(work_dir).name
    from simulator.paper.schemes import cell_config

    setting_text = ", ".join(f"{s}: {cell_config(cfg, setting=s, seed=0, num_traces=1).partition.describe()}"
                             for s in settings)
    trace_set = Path(cfg.traces.set).name
    return f"""# Scheme comparison on {dataset.upper()} (paper Table 3)

Generated by `flexfl sim schemes --dataset {dataset}` (see results/README.md for the
choices behind these numbers and the discussion of differences from the paper).
{chr(10) + note + chr(10) if note else ""}
Each cell: % improvement of final test accuracy (after round {cfg.rounds}), "B over A, C over B",
mean ± sample standard deviation over seeds {seeds}; improvements are computed per seed
(the three schemes of one seed share data, initial model, trace assignment and s draws).
Rows marked (paper) are the published values. Where every trace in use is always complete
(|T| = 1: trace T0), all devices finish E updates every round and A, B, C are the same
algorithm; that run is computed once and shared by the three schemes (marked in its JSON).

Setup: {n_devices} devices, {cfg.rounds} rounds, E = {r.required_updates} local updates ({r.unit}) per round,
batch size {r.batch_size_for(ds)}, eta_tau = {r.eta0_for(ds):g} / tau, traces `{trace_set}` (|T| = {num_traces}),
s drawn `{r.trace_sampling}` from the device's trace, fraction -> s rule `{r.s_rule}`,
sample counts {cfg.partition.sizes}, settings {setting_text}.

{paths['table']}
Speed on this machine: one {cfg.rounds}-round run took {run_s:.1f} s on average (its share of its cell:
the three schemes of a cell train together; {per_s:.0f} simulated device-updates per second, SGD steps
actually computed).

Per-run final accuracies: `{final_csv}`; per-round metrics of every run: `runs/{work_name}/`.

{plots}
"""


def cmd_table3(args: argparse.Namespace) -> int:
    from simulator.executors import executor_for
    from simulator.paper.table3 import READINGS, elapsed, run_table3, wall_time, write_page

    regime = _regime(args)
    readings = list(READINGS) if args.readings == "all" else [r.strip() for r in args.readings.split(",") if r.strip()]
    unknown = [r for r in readings if r not in READINGS]
    if unknown:
        raise ConfigError(f"--readings: unknown {unknown}; choose from {', '.join(READINGS)}")
    seeds = _parse_ints(args.seeds, "--seeds")
    num_traces = _parse_ints(args.num_traces_list, "--num-traces-list")
    work_dirs = {ds: (args.work_dir if args.work_dir and ds == args.dataset else args.out / "runs" / f"table3_{ds}")
                 for ds in SWEEP_DATASETS}
    timing = _read_timing(args.out, "table3")
    started = time.perf_counter()
    if not args.report_only:
        settings = [s.strip() for s in args.settings.split(",") if s.strip()]
        if not settings or set(settings) - {"iid", "niid"}:
            raise ConfigError(f"--settings: expected iid and/or niid, got {args.settings!r}")
        command = (f"flexfl sim table3 --dataset {args.dataset} --readings {args.readings} --settings {args.settings} "
                   f"--num-traces-list {args.num_traces_list} --seeds {args.seeds}{_regime_flags(regime)}")
        summaries = run_table3(args.dataset, readings, seeds=seeds, num_traces=num_traces, settings=settings,
                               work_dir=work_dirs[args.dataset], regime=regime, plan=(args.out, command),
                               executor=executor_for(jobs=args.jobs, ray_address=args.ray_address))
        computed = sum(not s.get("cached") for s in summaries)
        cached = len(summaries) - computed
        part = (f"{elapsed(started)} for `flexfl sim table3 --dataset {args.dataset} --readings {args.readings} "
                f"--seeds {args.seeds}{_regime_flags(regime)}` ({computed} runs computed, {cached} cached)")
        statement = wall_time(timing.get(args.dataset), part, computed=computed, cached=cached)
        if statement is not None:
            timing[args.dataset] = statement
    page = write_page(args.out, work_dirs={ds: d for ds, d in work_dirs.items() if d.exists()}, seeds=seeds,
                      timing=timing, plots=lambda ds, info: _table3_plots(info["out_dir"], ds, info), regime=regime,
                      replace_page=args.replace_page)
    _save_timing(page, "table3", timing)
    print(f"Table 3 page: {page}")
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    from simulator.executors import executor_for
    from simulator.paper.regime import regime_from_args
    from simulator.paper.strategies_page import TIMING_FILE, run_section, section_key, write_page
    from simulator.paper.table3 import elapsed, wall_time

    regime = regime_from_args(args)
    seeds = _parse_ints(args.seeds, "--seeds")
    num_traces = _parse_ints(args.num_traces_list, "--num-traces-list")
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or set(settings) - {"iid", "niid"}:
        raise ConfigError(f"--settings: expected iid and/or niid, got {args.settings!r}")
    timing_path = args.out / TIMING_FILE
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    if not args.report_only:
        command = (f"flexfl sim strategies --dataset {args.dataset} --unit {regime.unit} --eta0 {regime.eta0} "
                   f"--num-traces-list {args.num_traces_list} --settings {args.settings} --seeds {args.seeds}")
        started = time.perf_counter()
        summaries = run_section(args.out, args.dataset, regime, seeds=seeds, num_traces=num_traces,
                                settings=settings, command=command,
                                executor=executor_for(jobs=args.jobs, ray_address=args.ray_address))
        computed = sum(not s.get("cached") for s in summaries)
        key = section_key(args.dataset, regime)
        statement = wall_time(timing.get(key), f"{elapsed(started)} for `{command}` ({computed} runs computed, "
                              f"{len(summaries) - computed} cached)", computed=computed,
                              cached=len(summaries) - computed)
        if statement is not None:
            timing[key] = statement
    page = write_page(args.out, timing=timing, replace_page=args.replace_page)
    _save_timing(page, TIMING_FILE.removesuffix("_timing.json"), timing)
    print(f"strategies page: {page}")
    return 0


def _table3_plots(out: Path, dataset: str, info: dict) -> dict:
    """Accuracy per round of the headline reading, mean over seeds, one panel per |T|, per setting."""
    import numpy as np

    from simulator.report import plot_accuracy_curves
    from simulator.sim_rows import read_accuracy_curve

    paths = {}
    for setting in ("iid", "niid"):
        curves: dict[str, dict[str, list]] = {}
        for s in info["summaries"]:
            if s["setting"] != setting:
                continue
            acc = read_accuracy_curve(info["work_dir"] / f"{s['name']}.csv")
            curves.setdefault(f"|T| = {s['num_traces']}", {}).setdefault(s["scheme"], []).append(acc)
        if curves:
            path = out / f"table3_{dataset}_{setting}.png"
            plot_accuracy_curves(path, {k: {sc: np.mean(v, axis=0) for sc, v in by.items()}
                                        for k, by in sorted(curves.items(), key=lambda kv: int(kv[0].split()[-1]))},
                                 title=f"{dataset.upper()} {setting.upper()} (headline reading): test accuracy, "
                                       "mean over seeds")
            paths[f"{dataset}_{setting}"] = path
    return paths


# A page's wall times ({command or dataset: statement}) sit beside it in <name>_timing.json.
# They are read from --out and saved where the page went (simulator.report.page_dir), so a
# page sent to <out>/local leaves the committed times alone.


def _read_timing(out: Path, name: str) -> dict:
    path = out / f"{name}_timing.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _note_time(timing: dict, command: str, started: float, *, computed: int) -> None:
    """`command`'s wall time; a command that found every run cached keeps the time that computed them."""
    from simulator.paper.table3 import elapsed

    if computed:
        timing[command] = f"{elapsed(started)} for `{command}`"


def _save_timing(page: Path, name: str, timing: dict) -> None:
    path = page.parent / f"{name}_timing.json"
    text = json.dumps(timing, indent=1)
    if timing and not (path.is_file() and path.read_text() == text):
        with atomic_file(path) as f:
            f.write(text)


def cmd_table4(args: argparse.Namespace) -> int:
    from simulator.executors import executor_for
    from simulator.paper import table4

    regime = _regime(args)
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    bad = set(datasets) - set(SWEEP_DATASETS)
    if bad:
        raise ConfigError(f"--datasets: unknown {sorted(bad)}; use {' and/or '.join(SWEEP_DATASETS)}")
    seeds = _parse_ints(args.seeds, "--seeds")
    work_dirs = {ds: args.work_dir or args.out / "runs" / f"table4_{ds}" for ds in SWEEP_DATASETS}
    started = time.perf_counter()
    timing = _read_timing(args.out, "table4")
    for ds in datasets:
        t0 = time.perf_counter()
        if not args.report_only:
            summaries = table4.run_table4(ds, seeds=seeds, work_dir=work_dirs[ds], regime=regime,
                                          executor=executor_for(jobs=args.jobs, ray_address=args.ray_address))
            _note_time(timing, f"flexfl sim table4 --datasets {ds} --seeds {args.seeds}{_regime_flags(regime)}", t0,
                       computed=sum(not s.get("cached") for s in summaries))
    page = table4.write_page(args.out, work_dirs={ds: d for ds, d in work_dirs.items() if d.exists()}, seeds=seeds,
                             timing=timing, regime=regime, replace_page=args.replace_page)
    _save_timing(page, "table4", timing)
    print(f"Table 4 page: {page} ({time.perf_counter() - started:.0f} s)")
    return 0


def _paper_sweep(args: argparse.Namespace, module, name: str, command: str, **kw):
    """Compute (unless --report-only) the sweep of `module.groups` and write its page; returns write_page's result.

    `kw` goes to both `module.groups` and `module.write_page`."""
    from simulator.executors import executor_for
    from simulator.sweep import run_sweep

    regime = _regime(args)
    seeds = _parse_ints(args.seeds, "--seeds")
    work_dir = args.work_dir or args.out / "runs" / name
    started = time.perf_counter()
    timing = _read_timing(args.out, name)
    if not args.report_only:
        summaries = run_sweep(module.groups(seeds=seeds, regime=regime, **kw), work_dir=work_dir,
                              executor=executor_for(jobs=args.jobs, ray_address=args.ray_address))
        _note_time(timing, f"{command} --seeds {args.seeds}{_regime_flags(regime)}", started,
                   computed=sum(not s.get("cached") for s in summaries))
    result = module.write_page(args.out, work_dir=work_dir, seeds=seeds, timing="; ".join(timing.values()),
                               regime=regime, replace_page=args.replace_page, **kw)
    _save_timing(result[0] if isinstance(result, tuple) else result, name, timing)  # Table 5's: (page, c, acc)
    return result


def cmd_table5(args: argparse.Namespace) -> int:
    from simulator.paper import table5
    page, c, acc = _paper_sweep(args, table5, "table5", "flexfl sim table5")
    held = f"right in {acc:.1%} of held-out cases" if acc == acc else "not scored on held-out seeds"
    print(f"Table 5 page: {page}; auto rule: c = {c:g}, {held}")
    return 0


def cmd_arrivals_figure(args: argparse.Namespace) -> int:
    from simulator.paper import figure_arrivals
    flag = "" if args.dataset == "mnist" else f" --dataset {args.dataset}"
    page = _paper_sweep(args, figure_arrivals, figure_arrivals.file_stem(args.dataset),
                        f"flexfl sim arrivals-figure{flag}", dataset=args.dataset)
    print(f"multi-arrival figure: {page}")
    return 0


def cmd_operating_point(args: argparse.Namespace) -> int:
    from simulator.executors import executor_for
    from simulator.paper import operating_point
    from simulator.paper.table3 import elapsed

    started = time.perf_counter()
    work_dir = args.work_dir or args.out / "runs" / f"operating_point_{args.dataset}"
    best, _cands, summaries = operating_point.run_protocol(
        args.dataset, args.unit, work_dir=work_dir, executor=executor_for(jobs=args.jobs, ray_address=args.ray_address))
    computed = sum(not s.get("cached") for s in summaries)
    # Nothing computed: the choice keeps the wall time of the command that computed its runs.
    timing = (f"Wall time: {elapsed(started)} for `flexfl sim operating-point --dataset {args.dataset} --unit "
              f"{args.unit}` ({computed} of {len(summaries)} runs computed)." if computed else None)
    page = operating_point.write_outputs(args.out, args.dataset, args.unit, summaries, best, timing=timing,
                                         replace_page=args.replace_page)
    print(f"operating point for {args.dataset}, E in {args.unit}s: eta_0 = {best.eta0:g} (mean final test loss "
          f"{best.score:.4f} over {len(best.losses)} runs); page {page}")
    return 0


def _regime(args: argparse.Namespace):
    """The sweep's regime (--unit, --eta0); fills in args.out from it when --out was not given."""
    from simulator.paper.regime import out_dir, regime_from_args

    regime = regime_from_args(args)
    args.out = out_dir(args, regime)
    return regime


def _regime_flags(regime) -> str:
    return "" if regime.is_default else f" --unit {regime.unit} --eta0 {regime.eta0}"
