"""The page of `flexfl traces fidelity`: figures from the phases' data, CSVs, plots and results/trace_fidelity.md.

Input is plain data (FidelityInputs, gathered by trace_recorder.fidelity.experiment); the statistics are
trace_recorder.fidelity.stats'. Two comparisons:

(a) per device, the live run's s/E (over the rounds the recorder's rule keeps) against the
    recorded trace: mean difference, two-sample KS distance and its 5 % critical value, and
    what a per-device replay cannot carry: the correlation of s between devices in the same
    round and between a device's consecutive rounds (the simulator draws s independently).
(b) the live accuracy and loss per round against simulations replaying the recorded traces:
    - the band: the share of rounds the live curve lies inside the min-max of K simulations at
      seeds other than the live run's, beside the share a curve that is one more draw of the
      simulation has (measured on the simulations: each against the band of the other K - 1,
      live likewise against every such band; (K - 1) / (K + 1) for independent rounds). A
      seed fixes the initial model and the minibatches, whose effect persists over rounds, so
      this test is weak with one live run.
    - seed for seed: at the live seed and the K others, the simulation with s from the traces
      against the one with the live run's own s. At the live seed the latter must reproduce
      the live curve (a check); at each seed the pair differs only in where s comes from.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from flexfl.csv_records import converted, read_records
from flexfl.files import atomic_file
from flexfl.markdown import table
from trace_recorder.fidelity.stats import (
    band_share,
    exchangeable_inside_share,
    ks_critical,
    ks_distance,
    lag1_autocorrelation,
    mean_pairwise_correlation,
)

METRICS = ("test_acc", "test_loss")
LABEL = {"test_acc": "test accuracy", "test_loss": "test loss"}


@dataclass(frozen=True)
class FidelityInputs:
    """What the phases measured, as arrays; device order is the recording's (device k: trace k)."""

    devices: tuple[str, ...]
    conditions: dict[str, str]  # device -> its load, in words
    recorded: dict[str, np.ndarray]  # device -> s/E per recorded round
    live: dict[str, np.ndarray]  # device -> s/E per live round kept by the recorder's rule
    live_curve: dict[str, np.ndarray]  # "round", "test_acc", "test_loss": every live round
    band: dict[int, dict[str, np.ndarray]]  # seed -> "test_acc", "test_loss" of a simulation replaying the traces
    live_s_band: dict[int, dict[str, np.ndarray]]  # the same seeds, simulated with the live run's own s
    live_seed: int
    traces_at_live_seed: dict[str, np.ndarray]  # the traces replayed at the live run's seed
    live_s_replay: dict[str, np.ndarray]  # the live run's own s simulated at its seed: must equal the live curve
    traces_after_live_start: dict[int, dict[str, np.ndarray]]  # every seed: the live s in the start rounds, then traces
    start_rounds: int  # the live run's first rounds the recorder's rule drops as settling
    live_start: dict[str, np.ndarray]  # device -> s/E in those rounds
    facts: dict[str, Any] = field(default_factory=dict)  # command, CPU, deadline, rules, times, loads


@dataclass(frozen=True)
class DeviceFigures:
    device: str
    condition: str
    recorded_rounds: int
    live_rounds: int
    recorded_mean: float
    live_mean: float
    mean_diff: float  # live - recorded, in s/E
    ks: float
    ks_critical_5pct: float
    lag1_recorded: float
    lag1_live: float
    live_start_mean: float  # s/E in the live run's first rounds, which the recorder's rule drops (nan: none)

    @property
    def differs(self) -> bool:
        return self.ks > self.ks_critical_5pct


@dataclass(frozen=True)
class CurveFigures:
    metric: str
    inside_share: float  # live inside the K-simulation band, share of rounds
    independent_share: float  # (K - 1) / (K + 1)
    live_loo_share: float  # live inside the band of K - 1 simulations, mean over the K such bands (nan: K < 3)
    sim_loo_shares: tuple[float, ...]  # each simulation inside the band of the others
    live_final: float
    band_final: tuple[float, float]
    mean_gap_to_band_mean: float  # mean over rounds of |live - mean of the simulations|
    replay_max_gap: float  # max over rounds of |live - the live run's own s replayed|
    paired_seeds: tuple[int, ...]  # the live seed, then the band's
    paired_mean_diffs: tuple[float, ...]  # per seed, mean over rounds of (traces - live s)
    paired_final_diffs: tuple[float, ...]  # per seed, (traces - live s) in the last round
    start_mean_diffs: tuple[float, ...]  # per seed, mean over rounds of (traces after the live start - live s)
    seed_spread: float  # mean over rounds of the band's width (max - min over the K seeds, traces)

    @property
    def inside_as_often(self) -> bool:
        """The live curve is inside as often as a simulated one is (or no leave-one-out reference: K < 3)."""
        return not self.sim_loo_shares or self.live_loo_share >= min(self.sim_loo_shares)

    @property
    def one_sign(self) -> bool:
        """At every seed the traces give a curve on the same side of the live s's (on average over rounds)."""
        return _one_sign(self.paired_mean_diffs)

    @property
    def one_sign_after_start(self) -> bool:
        """The same with the live run's start rounds given to the traces."""
        return _one_sign(self.start_mean_diffs)

    @property
    def one_sign_chance(self) -> float:
        """How often all signs agree when the source of s makes no difference (each sign a fair coin)."""
        return 2 / 2 ** len(self.paired_mean_diffs)


def _one_sign(diffs: Sequence[float]) -> bool:
    d = np.array(diffs)
    return bool(np.all(d > 0) or np.all(d < 0))


def device_figures(inputs: FidelityInputs) -> list[DeviceFigures]:
    out = []
    for d in inputs.devices:
        rec, live = inputs.recorded[d], inputs.live[d]
        out.append(DeviceFigures(
            device=d, condition=inputs.conditions.get(d, ""), recorded_rounds=len(rec), live_rounds=len(live),
            recorded_mean=float(rec.mean()), live_mean=float(live.mean()), mean_diff=float(live.mean() - rec.mean()),
            ks=ks_distance(live, rec), ks_critical_5pct=ks_critical(len(live), len(rec)),
            lag1_recorded=lag1_autocorrelation(rec), lag1_live=lag1_autocorrelation(live),
            live_start_mean=float(inputs.live_start[d].mean()) if inputs.start_rounds else math.nan))
    return out


def curve_figures(inputs: FidelityInputs) -> list[CurveFigures]:
    seeds = sorted(inputs.band)
    out = []
    for m in METRICS:
        live = inputs.live_curve[m]
        sims = np.array([inputs.band[s][m] for s in seeds])  # [K, rounds]
        lo, hi = sims.min(axis=0), sims.max(axis=0)
        k = len(seeds)
        sim_loo: list[float] = []
        live_loo = math.nan
        if k >= 3:
            others = [np.delete(sims, j, axis=0) for j in range(k)]
            sim_loo = [band_share(sims[j], o.min(axis=0), o.max(axis=0)) for j, o in enumerate(others)]
            live_loo = float(np.mean([band_share(live, o.min(axis=0), o.max(axis=0)) for o in others]))
        pairs = [(inputs.live_seed, inputs.traces_at_live_seed[m], inputs.live_s_replay[m])]
        pairs += [(s, inputs.band[s][m], inputs.live_s_band[s][m]) for s in seeds]
        out.append(CurveFigures(
            metric=m, inside_share=band_share(live, lo, hi), independent_share=exchangeable_inside_share(k),
            live_loo_share=live_loo, sim_loo_shares=tuple(sim_loo), live_final=float(live[-1]),
            band_final=(float(lo[-1]), float(hi[-1])),
            mean_gap_to_band_mean=float(np.mean(np.abs(live - sims.mean(axis=0)))),
            replay_max_gap=float(np.max(np.abs(live - inputs.live_s_replay[m]))),
            paired_seeds=tuple(s for s, _, _ in pairs),
            paired_mean_diffs=tuple(float(np.mean(t - ls)) for _, t, ls in pairs),
            paired_final_diffs=tuple(float(t[-1] - ls[-1]) for _, t, ls in pairs),
            start_mean_diffs=tuple(float(np.mean(inputs.traces_after_live_start[s][m] - ls)) for s, _, ls in pairs),
            seed_spread=float(np.mean(hi - lo))))
    return out


def correlations(inputs: FidelityInputs) -> dict[str, float]:
    """Mean pairwise correlation of s/E between devices, per round, recorded and live."""
    return {"recorded": mean_pairwise_correlation(np.column_stack([inputs.recorded[d] for d in inputs.devices])),
            "live": mean_pairwise_correlation(np.column_stack([inputs.live[d] for d in inputs.devices]))}


# ---- files -----------------------------------------------------------------------------------


def write_page(inputs: FidelityInputs, page: Path) -> dict[str, Any]:
    """Write PAGE (markdown), PAGE_devices.csv, PAGE_curves.csv, PAGE_s.csv, PAGE_ecdf.png, PAGE_curves.png;
    return the figures."""
    page = Path(page)
    stem = page.with_suffix("")
    devs, curves, corr = device_figures(inputs), curve_figures(inputs), correlations(inputs)
    files = {"devices_csv": Path(f"{stem}_devices.csv"), "curves_csv": Path(f"{stem}_curves.csv"),
             "s_csv": Path(f"{stem}_s.csv"), "ecdf_png": Path(f"{stem}_ecdf.png"),
             "curves_png": Path(f"{stem}_curves.png")}
    _write_devices_csv(files["devices_csv"], devs)
    _write_s_csv(files["s_csv"], inputs)
    _write_curves_csv(files["curves_csv"], inputs)
    plot_ecdfs(inputs, files["ecdf_png"])
    plot_curves(inputs, files["curves_png"])
    with atomic_file(page) as f:
        f.write(render(inputs, devs, curves, corr, files))
    return {"devices": devs, "curves": curves, "correlation": corr, "files": {**files, "page": page}}


def _write_devices_csv(path: Path, devs: Sequence[DeviceFigures]) -> None:
    fields = ("device", "condition", "recorded_rounds", "live_rounds", "recorded_mean", "live_mean", "mean_diff",
              "ks", "ks_critical_5pct", "lag1_recorded", "lag1_live", "live_start_mean")
    with atomic_file(path) as f:
        w = csv.writer(f)
        w.writerow(fields)
        for d in devs:
            w.writerow([_csv(getattr(d, k)) for k in fields])


S_SOURCES = ("recorded", "live", "live_start")  # the trace; the live rounds kept; the live rounds dropped as settling


def _write_s_csv(path: Path, inputs: FidelityInputs) -> None:
    """Each device's s/E per round, recorded and live (a few kB): what the KS distances and lag-1
    autocorrelations are computed from, so that anyone can recompute them from the committed page."""
    series = {"recorded": inputs.recorded, "live": inputs.live, "live_start": inputs.live_start}
    with atomic_file(path) as f:
        w = csv.writer(f)
        w.writerow([f.name for f in fields(SLine)])
        for d in inputs.devices:
            for source in S_SOURCES:
                w.writerows([d, source, i, _csv(float(v))] for i, v in enumerate(series[source][d], 1))


def _source(text: str) -> str:
    if text not in S_SOURCES:
        raise ValueError(text)
    return text


@dataclass(frozen=True)
class SLine:
    """One line of a PAGE_s.csv: a device's s/E in one round of one source (S_SOURCES)."""

    device: str
    source: str = field(metadata=converted(_source, expected=" or ".join(S_SOURCES)))
    index: int  # the round's place in the source's series, from 1
    s_over_E: float


def read_s_csv(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """{source: {device: s/E per round}} from a PAGE_s.csv."""
    out: dict[str, dict[str, list[float]]] = {source: {} for source in S_SOURCES}
    for line in read_records(path, SLine):
        out[line.source].setdefault(line.device, []).append(line.s_over_E)
    return {source: {d: np.array(v) for d, v in by.items()} for source, by in out.items()}


def _write_curves_csv(path: Path, inputs: FidelityInputs) -> None:
    seeds = sorted(inputs.band)
    live = inputs.live_seed
    curves = {"live": inputs.live_curve, f"traces_seed{live}": inputs.traces_at_live_seed,
              f"live_s_seed{live}": inputs.live_s_replay,
              **{f"traces_seed{s}": inputs.band[s] for s in seeds},
              **{f"live_s_seed{s}": inputs.live_s_band[s] for s in seeds},
              **{f"traces_after_live_start_seed{s}": c for s, c in sorted(inputs.traces_after_live_start.items())}}
    header = ["round"] + [f"{m}_{name}" for m in METRICS for name in (*curves, "band_min", "band_max")]
    rows = []
    for i, rnd in enumerate(inputs.live_curve["round"]):
        row: list[Any] = [int(rnd)]
        for m in METRICS:
            band = [inputs.band[s][m][i] for s in seeds]
            row += [_csv(c[m][i]) for c in curves.values()] + [_csv(min(band)), _csv(max(band))]
        rows.append(row)
    with atomic_file(path) as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _csv(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ecdfs(inputs: FidelityInputs, path: Path) -> None:
    """One panel per device: the ECDF of s/E in the recording and in the live run."""
    plt = _plt()
    n = len(inputs.devices)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False)
    for ax, d in zip(axes.flat, inputs.devices):
        for values, label, color in ((inputs.recorded[d], "recorded", "tab:blue"),
                                     (inputs.live[d], "live", "tab:red")):
            x = np.sort(values)
            share = np.arange(1, len(x) + 1) / len(x)
            ax.step(np.concatenate([[0.0], x, [1.0]]), np.concatenate([[0.0], share, [1.0]]), where="post",
                    color=color, label=f"{label} (n={len(x)})")
        d_ks = ks_distance(inputs.live[d], inputs.recorded[d])
        ax.set_title(f"{d}: {inputs.conditions.get(d, '')}\nKS D = {d_ks:.3f}", fontsize=9)
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("s / E")
        ax.set_ylabel("share of rounds <= x")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curves(inputs: FidelityInputs, path: Path) -> None:
    """Accuracy and loss per round: the live run; the traces replayed (band over K seeds, and at the live seed);
    the live run's own s at the same K seeds (band)."""
    plt = _plt()
    seeds = sorted(inputs.band)
    rounds = inputs.live_curve["round"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, m in zip(axes, METRICS):
        scale = 100.0 if m == "test_acc" else 1.0
        for band, color, label in ((inputs.band, "tab:blue", "s from the traces"),
                                   (inputs.live_s_band, "tab:red", "the live run's s")):
            sims = scale * np.array([band[s][m] for s in seeds])
            ax.fill_between(rounds, sims.min(axis=0), sims.max(axis=0), color=color, alpha=0.2,
                            label=f"simulated, {label}: min-max of seeds {seeds[0]}-{seeds[-1]}")
        ax.plot(rounds, scale * inputs.traces_at_live_seed[m], color="tab:blue", lw=1, ls="--",
                label=f"simulated, s from the traces, live seed {inputs.live_seed}")
        ax.plot(rounds, scale * inputs.live_curve[m], color="tab:red", lw=1.3, label=f"live (seed {inputs.live_seed})")
        ax.set_xlabel("round")
        ax.set_ylabel(LABEL[m] + (" (%)" if m == "test_acc" else ""))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the page ----------------------------------------------------------------------------------


def _f(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.0f} %"


def _scale(metric: str) -> tuple[float, str]:
    """Accuracy in percentage points, loss as it is."""
    return (100.0, " pp") if metric == "test_acc" else (1.0, "")


def _head(inputs: FidelityInputs) -> list[str]:
    fx = inputs.facts
    lines = [
        "# Trace fidelity: do traces recorded on the emulated fleet predict live FL there?",
        "",
        f"Written by `{fx.get('command', 'flexfl traces fidelity')}` on {fx.get('date', '?')}; "
        f"wall time {fx.get('wall_s', 0) / 60:.1f} min ({fx.get('phase_times', '')}).",
        f"CPU: {fx.get('cpu_model', '?')}, {fx.get('cpus', '?')} logical CPUs (/proc/cpuinfo). "
        f"Load average (1 min) during the phases: {fx.get('load_text', '?')}.",
        "",
    ]
    if fx.get("shared_machine"):
        lines += [f"**The machine was shared.** Other CPU-heavy work ran beside this measurement (load average up to "
                  f"{fx.get('load_max', 0):.1f} on {fx.get('cpus', '?')} cores). Each device's s depends on timing, so "
                  "these are figures from a busy machine, not a quiet one; the recording and the live run were "
                  "exposed alike only as far as that other work stayed alike.", ""]
    return lines


def _setup(inputs: FidelityInputs, devs: Sequence[DeviceFigures]) -> list[str]:
    fx = inputs.facts
    return [
        "## Setup",
        "",
        f"- Emulated fleet: one network namespace per device with a tc tbf upload limit and a cgroup v1 CPU quota of "
        f"{fx.get('cpu_quota', '?')} CPU; each device's load set through its loadgen daemon (stress-ng competitor, "
        "tbf), by the recorder's own code in both phases.",
        "- Devices (trace = load): " + ", ".join(f"{d} = {inputs.conditions.get(d, '')}" for d in inputs.devices)
        + ".",
        f"- Recording: `flexfl traces record` with profile {fx.get('profile', '?')}: {fx.get('recorded_rounds', '?')} "
        f"rounds per device, calibrated deadline {fx.get('deadline_s', 0):g} s, E = {fx.get('E', '?')} "
        f"{fx.get('unit', '')}s.",
        f"- Live: {fx.get('live_rounds', '?')} rounds of FL from a fresh model on a fresh fleet of the same spec, "
        "the same loads, deadline and E; agents follow no trace (deadline mode). "
        f"{fx.get('rules', '')}. The s comparison uses the {devs[0].live_rounds if devs else 0} rounds the "
        "recorder's rule keeps (after the first round every device received the model, with a successor).",
        f"- Simulations: the simulator replays the recorded set, device k drawing s from its own trace "
        f"(iid per round, the sampler's default), at the live run's seed {inputs.live_seed} and {len(inputs.band)} "
        f"others ({', '.join(str(s) for s in sorted(inputs.band))}); and at the same seeds with the live run's own s "
        "per device and round. A seed fixes the initial model and the minibatches.",
        "",
    ]


def _devices_section(inputs: FidelityInputs, devs: Sequence[DeviceFigures], corr: dict[str, float],
                     files: dict[str, Path]) -> list[str]:
    cpu_rec, cpu_live = inputs.facts.get("cpu_recorded", {}), inputs.facts.get("cpu_live", {})
    rows = [[d.device, d.condition, f"{d.recorded_rounds} / {d.live_rounds}", _f(d.recorded_mean), _f(d.live_mean),
             f"{d.mean_diff:+.3f}", f"**{_f(d.ks)}**", _f(d.ks_critical_5pct),
             f"{_f(d.lag1_recorded, 2)} / {_f(d.lag1_live, 2)}",
             f"{_opt(cpu_rec.get(d.device))} / {_opt(cpu_live.get(d.device))}", _f(d.live_start_mean)] for d in devs]
    devices = table(["device", "load", "rounds rec / live", "mean s/E rec", "mean s/E live", "live - rec", "KS D",
                     "D at 5 %", "lag-1 autocorr. rec / live", "competitor CPU % rec / live",
                     f"live, first {inputs.start_rounds} round(s)"], rows)
    carried = table(["", "recorded", "live", "simulated"], [
        ["mean correlation of s/E between devices in the same round", _f(corr["recorded"], 2), _f(corr["live"], 2),
         "0 (independent draws)"],
        ["mean lag-1 autocorrelation of a device's s/E", _f(_nanmean([d.lag1_recorded for d in devs]), 2),
         _f(_nanmean([d.lag1_live for d in devs]), 2), "0 (independent draws)"]])
    return [
        "## (a) s/E per device: live vs recorded",
        "",
        *devices.splitlines(),
        "",
        f"![ECDFs of s/E per device, recorded and live]({files['ecdf_png'].name})",
        "",
        "KS D is the largest gap between the two empirical CDFs of s/E (numpy, trace_recorder/fidelity/stats.py). "
        "\"D at 5 %\" is the asymptotic two-sample critical value c(0.05) sqrt((n + m) / (n m)): it assumes "
        "independent rounds (a positive lag-1 autocorrelation means fewer independent rounds, so D above it is "
        "weaker evidence than it looks) and a continuous variable (s/E lies on a grid of 1/E, which makes it "
        "conservative).",
        "",
        "What a per-device trace cannot carry, the simulator's iid draws set to zero:",
        "",
        *carried.splitlines(),
        "",
    ]


def _seed_section(inputs: FidelityInputs, curves: Sequence[CurveFigures], files: dict[str, Path]) -> list[str]:
    rows = []
    for c in curves:
        sc, unit = _scale(c.metric)
        for seed, mean_d, final_d, start_d in zip(c.paired_seeds, c.paired_mean_diffs, c.paired_final_diffs,
                                                   c.start_mean_diffs):
            live = " (live seed)" if seed == inputs.live_seed else ""
            rows.append([LABEL[c.metric], f"{seed}{live}", f"{sc * mean_d:+.3f}{unit}", f"{sc * final_d:+.3f}{unit}",
                         f"{sc * start_d:+.3f}{unit}"])
    pairs = table(["metric", "seed", "mean difference over rounds", "difference in the last round",
                   f"mean difference, the traces after the live run's first {inputs.start_rounds} round(s)"], rows)
    return [
        "## (b) Live accuracy and loss vs simulations replaying the recorded traces",
        "",
        f"![live curves against the simulated bands]({files['curves_png'].name})",
        "",
        "**Seed for seed.** At each seed, the simulation with s drawn from the traces against the one with the live "
        "run's own s: the pair differs only in where s comes from. Differences are traces - live s; accuracy in "
        "percentage points.",
        "",
        *pairs.splitlines(),
        "",
        "For scale: the seeds' own spread (mean over rounds of max - min of the traces' simulations) is "
        + ", ".join(f"{_scale(c.metric)[0] * c.seed_spread:.3f}{_scale(c.metric)[1]} in {LABEL[c.metric]}"
                    for c in curves)
        + ". At the live seed the live run's own s reproduces the live curve within "
        + ", ".join(f"{_scale(c.metric)[0] * c.replay_max_gap:.4f}{_scale(c.metric)[1]} ({LABEL[c.metric]}, largest "
                    "gap)" for c in curves)
        + ": the agents and the simulator's row trainer differ in float rounding only, so the simulator fed the same "
        "s is the live run.",
        "",
    ]


def _band_section(inputs: FidelityInputs, curves: Sequence[CurveFigures]) -> list[str]:
    k = len(inputs.band)
    rows = []
    for c in curves:
        sc, unit = _scale(c.metric)
        rows.append([LABEL[c.metric], f"**{_pct(c.inside_share)}**", _pct(c.independent_share),
                     _pct(c.live_loo_share), ", ".join(_pct(s) for s in c.sim_loo_shares) or "n/a",
                     f"{sc * c.live_final:.3f}", f"{sc * c.band_final[0]:.3f}-{sc * c.band_final[1]:.3f}",
                     f"{sc * c.mean_gap_to_band_mean:.3f}{unit}"])
    band = table(["metric", f"live inside the {k}-seed band", "for independent rounds",
                  f"live inside a {k - 1}-seed band", "each simulation inside the others' band", "live final",
                  "simulated final (min-max)", "mean abs(live - simulated mean)"], rows)
    return [
        f"**The band.** The live curve against the min-max of the {k} simulations replaying the traces at seeds other "
        "than its own:",
        "",
        *band.splitlines(),
        "",
        "A live run that were one more draw of the simulation would lie inside a "
        f"{k}-seed band in (K - 1) / (K + 1) = {_pct(exchangeable_inside_share(k))} of rounds if rounds were "
        "independent. They are not: a seed's initial model and minibatches keep a curve above or below the others "
        "for many rounds, so the reference measured on the simulations themselves (each against the band of the "
        f"other K - 1, live against the same bands) is the fairer one, and with one live run even a live curve "
        f"outside the band in every round is what one seed in {k + 1} does. The seed-for-seed comparison above "
        "removes the seed's effect and is the one the verdict uses for the curves.",
        "",
    ]


def render(inputs: FidelityInputs, devs: Sequence[DeviceFigures], curves: Sequence[CurveFigures],
           corr: dict[str, float], files: dict[str, Path]) -> str:
    fx = inputs.facts
    acc = next(c for c in curves if c.metric == "test_acc")
    cpu = (fx.get("cpu_recorded", {}), fx.get("cpu_live", {}))
    lines = [*_head(inputs), *_setup(inputs, devs), *_devices_section(inputs, devs, corr, files),
             *_seed_section(inputs, curves, files), *_band_section(inputs, curves), "## Does the loop close?", "",
             *verdict(devs, curves, corr, acc, start_rounds=inputs.start_rounds, cpu=cpu)]
    s_file = f", `{files['s_csv'].name}` (each device's s/E per round, recorded and live: the KS distances' inputs)" \
        if "s_csv" in files else ""
    lines += ["", f"Data: `{files['devices_csv'].name}` (per device), `{files['curves_csv'].name}` (per round)"
              f"{s_file}; work folder `{fx.get('work', '?')}`.", ""]
    return "\n".join(lines)


def _s_verdict(devs: Sequence[DeviceFigures], cpu: tuple[dict, dict]) -> str:
    def competitor(d: DeviceFigures) -> str:
        rec, live = cpu[0].get(d.device), cpu[1].get(d.device)
        if rec is None or live is None:
            return ""
        return f"; its competitor took {rec:.0f} % of the device's CPU budget recording, {live:.0f} % live"

    differ = [d for d in devs if d.differs]
    if differ:
        return (f"- **s: no, for {len(differ)} of {len(devs)} devices.** The live distribution of s/E differs from "
                "the recorded one beyond the 5 % critical KS distance for "
                + ", ".join(f"{d.device} (D = {d.ks:.3f} > {d.ks_critical_5pct:.3f}, mean {d.mean_diff:+.3f}"
                            f"{competitor(d)})" for d in differ) + ".")
    return (f"- **s: yes.** For every device the live distribution of s/E is within the 5 % critical KS "
            f"distance of its recorded trace (largest D = {max(d.ks for d in devs):.3f}, largest mean "
            f"difference {max((d.mean_diff for d in devs), key=abs):+.3f}).")


def _diffs(c: CurveFigures, *, start: bool = False) -> str:
    sc, unit = _scale(c.metric)
    d = np.array(c.start_mean_diffs if start else c.paired_mean_diffs) * sc
    return (f"{LABEL[c.metric]}: traces - live s {d.mean():+.3f}{unit} on average over rounds and seeds "
            f"({d.min():+.3f} to {d.max():+.3f}; the seeds' own spread {sc * c.seed_spread:.3f}{unit})")


def _curves_verdict(devs: Sequence[DeviceFigures], curves: Sequence[CurveFigures], acc: CurveFigures, *,
                    start_rounds: int) -> list[str]:
    one_sided = [c for c in curves if c.one_sign]
    if not one_sided:
        return ["- **Curves: yes.** Seed for seed, the traces' curves lie on either side of the live s's: "
                + "; ".join(_diffs(c) for c in curves) + "."]
    chance = _pct(one_sided[0].one_sign_chance)
    out = [f"- **Curves: no.** At every one of the {len(acc.paired_seeds)} seeds the traces give a curve on the same "
           "side of the live run's s: " + "; ".join(_diffs(c) for c in one_sided)
           + f". Were the source of s irrelevant, all signs would agree with probability {chance}."]
    if any(c.one_sign_after_start for c in curves):
        return [*out, f"- Giving the traces the live run's first {start_rounds} round(s) (which the recorder drops) "
                "does not remove the gap: " + "; ".join(_diffs(c, start=True) for c in curves) + "."]
    return [*out, f"- **The start explains it.** Given the live run's own s in its first {start_rounds} "
            "round(s), which the recorder drops as settling rounds so that no trace holds them, the "
            "traces' curves lie on either side of the live s's: "
            + "; ".join(_diffs(c, start=True) for c in curves)
            + ". In those rounds the live devices did "
            + ", ".join(f"{d.device} {_f(d.live_start_mean, 2)}" for d in devs)
            + " of E (their traces' means: " + ", ".join(f"{_f(d.recorded_mean, 2)}" for d in devs)
            + "): in its first round an agent has measured no upload or update time yet, so its budget "
            "(edge_agent.deadline) lets it train as if the upload took no time. Under eta_0 / tau the "
            "first round has the largest learning rate, so its extra work shows for many rounds."]


def _band_verdict(acc: CurveFigures) -> str:
    loo = acc.sim_loo_shares
    return (f"- The band alone: the live accuracy is inside the {len(loo) or '?'}-seed band in "
            f"{_pct(acc.inside_share)} of rounds"
            + (f"; against bands of K - 1 seeds {_pct(acc.live_loo_share)}, where the simulations themselves are "
               f"inside in {_pct(min(loo))}-{_pct(max(loo))}"
               + ("" if acc.inside_as_often else ", so the live curve is the least inside of the "
                  f"{len(loo) + 1} curves (chance {_pct(1 / (len(loo) + 1))} with one live run)") if loo else "")
            + ".")


def _between_devices_verdict(devs: Sequence[DeviceFigures], corr: dict[str, float]) -> list[str]:
    r_rec, r_live = corr["recorded"], corr["live"]
    if any(not math.isnan(r) and r > 0.1 for r in (r_rec, r_live)):
        out = [f"- **Contention between devices**: s/E of different devices in the same round correlate "
               f"(mean r = {_f(r_rec, 2)} recorded, {_f(r_live, 2)} live): devices were slowed together, which "
               "a per-device trace replayed with independent draws cannot reproduce."]
    else:
        out = [f"- Devices' s/E in the same round hardly correlate (mean r = {_f(r_rec, 2)} recorded, "
               f"{_f(r_live, 2)} live): no sign of contention between devices that the per-device replay misses."]
    patterned = [d for d in devs if abs(d.lag1_recorded) > 0.3 and abs(d.lag1_live) > 0.3]
    if patterned:
        out.append("- **Order within a device's trace**: " + ", ".join(
            f"{d.device} (lag-1 r = {d.lag1_recorded:+.2f} recorded, {d.lag1_live:+.2f} live)" for d in patterned)
            + f" {'follows' if len(patterned) == 1 else 'follow'} a round-to-round pattern in both runs that the "
            "simulator's iid draws drop (the sampler's "
            "`replay` mode keeps the order). A negative r on an upload-limited device is the agent's upload estimate "
            "at work: after a slow upload the estimate leaves no time to train (s = 0, reason upload); each such "
            "round halves the unmeasured estimate (edge_agent.deadline) until the device trains again, measures a "
            "slow upload again, and idles again.")
    return out


def verdict(devs: Sequence[DeviceFigures], curves: Sequence[CurveFigures], corr: dict[str, float],
            acc: CurveFigures, *, start_rounds: int, cpu: tuple[dict, dict] = ({}, {})) -> list[str]:
    """The page's answers, one bullet each: s per device, the curves seed for seed, the band, between devices."""
    return [_s_verdict(devs, cpu), *_curves_verdict(devs, curves, acc, start_rounds=start_rounds),
            _band_verdict(acc), *_between_devices_verdict(devs, corr)]


def _opt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _nanmean(values: Sequence[float]) -> float:
    v = [x for x in values if not math.isnan(x)]
    return float(np.mean(v)) if v else math.nan
