"""`flexfl sim ...`: single simulation runs and the paper's scheme comparison."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from flexfl.errors import ConfigError
from flexfl.files import read_toml
from simulator.paper import PAPER_DEVICES, SETTINGS

# Simulation modules (torch, the trainers) are imported by the handlers, so that building
# the `flexfl` parser stays light for the edge agent.


def register(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("sim", help="simulate federated training over participation traces")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")

    run = sim_sub.add_parser("run", help="one simulated run per scheme on the same data and traces")
    _add_config_flags(run)
    run.add_argument("--schemes", default="A,B,C", help="comma-separated schemes to run (default A,B,C)")
    run.add_argument("--out", type=Path, default=Path("out/sim"), help="results folder (default out/sim)")
    run.add_argument("--progress-every", type=int, default=0, help="print progress every N rounds (default: rounds/10)")
    run.set_defaults(func=cmd_run)

    cmp_ = sim_sub.add_parser("schemes", help="the paper's Table 3: Schemes A/B/C over |T| = 1..8, IID and non-IID")
    _add_config_flags(cmp_)
    cmp_.add_argument("--settings", default="iid,niid", help="comma-separated: iid, niid (default both)")
    cmp_.add_argument("--num-traces-list", default="1-8", help="|T| values, e.g. 1-8 or 1,3,5,8 (default 1-8)")
    cmp_.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    cmp_.add_argument("--jobs", type=int, default=2, help="parallel worker processes (default 2)")
    cmp_.add_argument("--work-dir", type=Path, default=None, help="per-run CSV/JSON files, reused when rerun (default <out>/runs/schemes_<dataset>)")
    cmp_.add_argument("--out", type=Path, default=Path("results"), help="where the table, CSVs and plots go (default results)")
    cmp_.add_argument("--report-only", action="store_true",
                      help="write the table from the runs already in the work folder; compute nothing")
    cmp_.add_argument("--note", default="", help="a paragraph for the table file (e.g. why a setting differs from the paper)")
    cmp_.set_defaults(func=cmd_schemes)


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TOML file with SimConfig fields (flags override it)")
    p.add_argument("--dataset", choices=sorted(SETTINGS), help="default synthetic")
    iid = p.add_mutually_exclusive_group()
    iid.add_argument("--iid", dest="iid", action="store_true", default=None, help="IID data")
    iid.add_argument("--non-iid", dest="iid", action="store_false", help="non-IID data (default)")
    p.add_argument("--alpha", type=float, help="SYNTHETIC alpha (default 1)")
    p.add_argument("--beta", type=float, help="SYNTHETIC beta (default 1)")
    p.add_argument("--devices", dest="n_devices", type=int, help="number of devices (default: 50, or the paper's for `schemes`)")
    p.add_argument("--rounds", type=int, help="rounds (default 200)")
    p.add_argument("--E", dest="E", type=int, help="required local updates per round (default 20)")
    p.add_argument("--trace-set", dest="trace_set", help="trace set folder (default traces/paper)")
    p.add_argument("--num-traces", dest="num_traces", type=int, help="|T|: devices draw from the first |T| traces (default 8)")
    p.add_argument("--sampling", choices=["iid", "replay"], help="s per round: i.i.d. from the trace (default) or in order")
    p.add_argument("--s-rule", dest="s_rule", choices=["round", "floor"], help="fraction -> s rule (default round)")
    p.add_argument("--seed", type=int, help="seed (default 0)")
    p.add_argument("--eta0", type=float, help="initial learning rate (default: the paper's per dataset)")
    p.add_argument("--batch-size", dest="batch_size", type=int, help="minibatch size (default: the paper's per dataset)")
    p.add_argument("--unit", choices=["step", "epoch"], help="one local update = one SGD step (default) or one pass")
    p.add_argument("--trainer", choices=["auto", "batched", "plain"], help="batched (vmap), plain (per device), or auto (default: batched for logreg, plain otherwise)")
    p.add_argument("--total-samples", dest="total_samples", type=int, help="samples spread over devices (default per dataset)")
    p.add_argument("--sizes", choices=["pareto", "equal"], help="samples per device: Pareto(0.5) (default) or equal")
    p.add_argument("--emnist-root", dest="emnist_root", help="folder with EMNIST in torchvision layout")


def config_from_args(args: argparse.Namespace, **defaults):
    """Dataclass defaults < `defaults` < TOML config file < CLI flags; returns a resolved SimConfig."""
    from simulator.engine import SimConfig

    values = dict(defaults)
    names = {f.name for f in fields(SimConfig)}
    if args.config is not None:
        loaded = read_toml(args.config)
        unknown = set(loaded) - names
        if unknown:
            raise ConfigError(f"{args.config}: unknown keys {sorted(unknown)}; valid keys: {sorted(names)}")
        values.update(loaded)
    values.update({k: v for k, v in vars(args).items() if k in names and v is not None})
    try:
        return SimConfig(**values).resolved()
    except TypeError as exc:
        raise ConfigError(f"bad configuration: {exc}") from exc


def _parse_ints(text: str, what: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-")
                out.extend(range(int(lo), int(hi) + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise ConfigError(f"{what}: expected integers like 1-8 or 1,3,5, got {text!r}") from None
    return out


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from simulator.engine import load_data, records_as_rows, run_simulation
    from simulator.report import plot_accuracy_curves, write_csv_atomic
    from trace_recorder.format import read_trace_set

    cfg = config_from_args(args)
    schemes = [s.strip().upper() for s in args.schemes.split(",") if s.strip()]
    started = time.perf_counter()
    data = load_data(cfg)
    traces = read_trace_set(Path(cfg.trace_set))
    every = args.progress_every or max(1, cfg.rounds // 10)
    rows, curves, finals, updates, sim_s = [], {}, {}, 0, 0.0
    print(f"flexfl sim: {cfg.dataset} {'IID' if cfg.iid else 'non-IID'}, {cfg.n_devices} devices, "
          f"|T|={cfg.num_traces} of {traces.path}, E={cfg.E}, {cfg.rounds} rounds, schemes {','.join(schemes)}", flush=True)
    for scheme in schemes:
        c = replace(cfg, scheme=scheme)
        t0 = time.perf_counter()

        def progress(r, scheme=scheme, t0=t0):
            if r.round % every == 0 or r.round == c.rounds:
                print(f"  scheme {scheme} round {r.round}/{c.rounds}: test acc {100 * r.test_acc:.2f}% "
                      f"loss {r.test_loss:.3f} active {r.active}/{c.n_devices} ({time.perf_counter() - t0:.1f} s)", flush=True)

        result = run_simulation(c, data=data, traces=traces, on_round=progress)
        rows.extend(records_as_rows(result))
        curves[scheme] = np.array([r.test_acc for r in result.records])
        finals[scheme] = result.final_accuracy
        updates += result.device_updates
        sim_s += result.wall_s
    out: Path = args.out
    write_csv_atomic(out / "rounds.csv", rows)
    plot_accuracy_curves(out / "accuracy.png", {f"|T| = {cfg.num_traces}": curves},
                         title=f"{cfg.dataset.upper()} {'IID' if cfg.iid else 'non-IID'}, {cfg.n_devices} devices")
    summary = {"config": asdict(cfg), "final_acc": finals, "wall_s": time.perf_counter() - started,
               "device_updates": updates, "device_updates_per_s": updates / sim_s if sim_s else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    accs = " ".join(f"{k} {100 * v:.2f}%" for k, v in finals.items())
    print(f"final test accuracy: {accs} | {summary['wall_s']:.1f} s, {updates / sim_s:.0f} device-updates/s | "
          f"results in {out}/ (rounds.csv, accuracy.png, summary.json)")
    return 0


def cmd_schemes(args: argparse.Namespace) -> int:
    from simulator.schemes import finished_runs, run_comparison, speed_figures, write_outputs

    dataset = args.dataset or "synthetic"
    cfg = config_from_args(args, dataset=dataset, n_devices=PAPER_DEVICES[dataset])
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
        summaries = run_comparison(cfg, settings=settings, num_traces=num_traces, seeds=seeds,
                                   work_dir=work_dir, jobs=max(1, args.jobs))
    paths = write_outputs(dataset, summaries, work_dir=work_dir, out_dir=args.out, settings=settings)
    run_s, per_s = speed_figures(summaries)
    md = args.out / f"schemes_{dataset}.md"
    md.write_text(_markdown(dataset, cfg, settings, num_traces, seeds, paths, run_s, per_s, note=args.note,
                            work_dir=work_dir))
    print(f"{len(summaries)} runs in {time.perf_counter() - started:.0f} s; one {cfg.rounds}-round run takes "
          f"{run_s:.1f} s on average ({per_s:.0f} device-updates/s); table in {md}")
    return 0


def _markdown(dataset, cfg, settings, num_traces, seeds, paths, run_s, per_s, *, note: str = "", work_dir: Path) -> str:
    plots = "\n".join(f"![{k}]({Path(v).name})" for k, v in paths.items() if k.startswith("plot_"))
    setting_text = ", ".join(
        f"{s}: " + ", ".join(f"{k}={v}" for k, v in SETTINGS[dataset][s].items()) for s in settings)
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

Setup: {cfg.n_devices} devices, {cfg.rounds} rounds, E = {cfg.E} local SGD steps per round,
batch size {cfg.batch_size}, eta_tau = {cfg.eta0:g} / tau, traces `{Path(cfg.trace_set).name}` (|T| = {num_traces}),
s drawn `{cfg.sampling}` from the device's trace, fraction -> s rule `{cfg.s_rule}`,
sample counts Type-I Pareto(0.5), settings {setting_text}.

{paths['table']}
Speed on this machine: one {cfg.rounds}-round run took {run_s:.1f} s on average
({per_s:.0f} simulated device-updates per second, SGD steps actually computed).

Per-run final accuracies: `{Path(paths['final_csv']).name}`; per-round metrics of every run: `runs/{Path(work_dir).name}/`.

{plots}
"""
