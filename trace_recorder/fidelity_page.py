"""The page of `flexfl traces fidelity`: figures from the phases' data, CSVs, plots and results/trace_fidelity.md.

Input is plain data (FidelityInputs, gathered by trace_recorder.fidelity); the statistics are
trace_recorder.fidelity_stats'. Two comparisons:

(a) per device, the live run's s/E (over the rounds the recorder's rule keeps) against the
    recorded trace: mean difference, two-sample KS distance and its 5 % critical value, and
    what a per-device replay cannot carry: the correlation of s between devices in the same
    round and between a device's consecutive rounds (the simulator draws s independently).
(b) the live accuracy and loss per round against the min-max band of K simulations replaying
    the recorded traces: the share of rounds inside, beside the share a curve that is one
    more draw of the simulation has. That reference is measured on the simulations (each
    against the band of the other K - 1, live likewise against every such band), so the
    autocorrelation of curves is in it; (K - 1) / (K + 1) is the value for independent rounds.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flexfl.files import atomic_file
from trace_recorder.fidelity_stats import (
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
    live_s_replay: dict[str, np.ndarray]  # the simulation of the live run's own s at its seed
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

    @property
    def consistent(self) -> bool:
        """The live curve is inside as often as a simulated one is (or no leave-one-out reference: K < 3)."""
        return not self.sim_loo_shares or self.live_loo_share >= min(self.sim_loo_shares)


def device_figures(inputs: FidelityInputs) -> list[DeviceFigures]:
    out = []
    for d in inputs.devices:
        rec, live = inputs.recorded[d], inputs.live[d]
        out.append(DeviceFigures(
            device=d, condition=inputs.conditions.get(d, ""), recorded_rounds=len(rec), live_rounds=len(live),
            recorded_mean=float(rec.mean()), live_mean=float(live.mean()), mean_diff=float(live.mean() - rec.mean()),
            ks=ks_distance(live, rec), ks_critical_5pct=ks_critical(len(live), len(rec)),
            lag1_recorded=lag1_autocorrelation(rec), lag1_live=lag1_autocorrelation(live)))
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
        out.append(CurveFigures(
            metric=m, inside_share=band_share(live, lo, hi), independent_share=exchangeable_inside_share(k),
            live_loo_share=live_loo, sim_loo_shares=tuple(sim_loo), live_final=float(live[-1]),
            band_final=(float(lo[-1]), float(hi[-1])),
            mean_gap_to_band_mean=float(np.mean(np.abs(live - sims.mean(axis=0)))),
            replay_max_gap=float(np.max(np.abs(live - inputs.live_s_replay[m])))))
    return out


def correlations(inputs: FidelityInputs) -> dict[str, float]:
    """Mean pairwise correlation of s/E between devices, per round, recorded and live."""
    return {"recorded": mean_pairwise_correlation(np.column_stack([inputs.recorded[d] for d in inputs.devices])),
            "live": mean_pairwise_correlation(np.column_stack([inputs.live[d] for d in inputs.devices]))}


# ---- files -----------------------------------------------------------------------------------


def write_page(inputs: FidelityInputs, page: Path) -> dict[str, Any]:
    """Write PAGE (markdown), PAGE_devices.csv, PAGE_curves.csv, PAGE_ecdf.png, PAGE_curves.png; return the figures."""
    page = Path(page)
    stem = page.with_suffix("")
    devs, curves, corr = device_figures(inputs), curve_figures(inputs), correlations(inputs)
    files = {"devices_csv": Path(f"{stem}_devices.csv"), "curves_csv": Path(f"{stem}_curves.csv"),
             "ecdf_png": Path(f"{stem}_ecdf.png"), "curves_png": Path(f"{stem}_curves.png")}
    _write_devices_csv(files["devices_csv"], devs)
    _write_curves_csv(files["curves_csv"], inputs)
    plot_ecdfs(inputs, files["ecdf_png"])
    plot_curves(inputs, files["curves_png"])
    with atomic_file(page) as f:
        f.write(render(inputs, devs, curves, corr, files))
    return {"devices": devs, "curves": curves, "correlation": corr, "files": {**files, "page": page}}


def _write_devices_csv(path: Path, devs: Sequence[DeviceFigures]) -> None:
    fields = ("device", "condition", "recorded_rounds", "live_rounds", "recorded_mean", "live_mean", "mean_diff",
              "ks", "ks_critical_5pct", "lag1_recorded", "lag1_live")
    with atomic_file(path) as f:
        w = csv.writer(f)
        w.writerow(fields)
        for d in devs:
            w.writerow([_csv(getattr(d, k)) for k in fields])


def _write_curves_csv(path: Path, inputs: FidelityInputs) -> None:
    seeds = sorted(inputs.band)
    header = ["round"] + [f"{src}_{m}" for m in METRICS for src in ("live", "live_s_replay", "band_min", "band_max")] \
        + [f"seed{s}_{m}" for m in METRICS for s in seeds]
    rows = []
    for i, rnd in enumerate(inputs.live_curve["round"]):
        row: list[Any] = [int(rnd)]
        for m in METRICS:
            sims = [inputs.band[s][m][i] for s in seeds]
            row += [_csv(inputs.live_curve[m][i]), _csv(inputs.live_s_replay[m][i]), _csv(min(sims)), _csv(max(sims))]
        row += [_csv(inputs.band[s][m][i]) for m in METRICS for s in seeds]
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
    """Accuracy and loss per round: the live run, the band of the K simulations, their mean, the live s replayed."""
    plt = _plt()
    seeds = sorted(inputs.band)
    rounds = inputs.live_curve["round"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, m in zip(axes, METRICS):
        sims = np.array([inputs.band[s][m] for s in seeds])
        scale = 100.0 if m == "test_acc" else 1.0
        ax.fill_between(rounds, scale * sims.min(axis=0), scale * sims.max(axis=0), color="tab:blue", alpha=0.25,
                        label=f"simulated, traces replayed: min-max of {len(seeds)} seeds")
        ax.plot(rounds, scale * sims.mean(axis=0), color="tab:blue", lw=1, ls="--", label="simulated mean")
        ax.plot(rounds, scale * inputs.live_s_replay[m], color="black", lw=1, ls=":",
                label="simulated with the live run's own s")
        ax.plot(rounds, scale * inputs.live_curve[m], color="tab:red", lw=1.3, label="live")
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


def render(inputs: FidelityInputs, devs: Sequence[DeviceFigures], curves: Sequence[CurveFigures],
           corr: dict[str, float], files: dict[str, Path]) -> str:
    fx = inputs.facts
    k = len(inputs.band)
    acc = next(c for c in curves if c.metric == "test_acc")
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
    lines += [
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
        f"(iid per round, the sampler's default), at {k} seeds other than the live run's "
        f"({', '.join(str(s) for s in sorted(inputs.band))}); and at the live seed with the live run's own s.",
        "",
        "## (a) s/E per device: live vs recorded",
        "",
        "| device | load | rounds rec / live | mean s/E rec | mean s/E live | live - rec | KS D | D at 5 % | "
        "lag-1 autocorr. rec / live | competitor CPU % rec / live |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    cpu_rec, cpu_live = fx.get("cpu_recorded", {}), fx.get("cpu_live", {})
    for d in devs:
        cpu = f"{_opt(cpu_rec.get(d.device))} / {_opt(cpu_live.get(d.device))}"
        lines.append(f"| {d.device} | {d.condition} | {d.recorded_rounds} / {d.live_rounds} | {_f(d.recorded_mean)} | "
                     f"{_f(d.live_mean)} | {d.mean_diff:+.3f} | **{_f(d.ks)}** | {_f(d.ks_critical_5pct)} | "
                     f"{_f(d.lag1_recorded, 2)} / {_f(d.lag1_live, 2)} | {cpu} |")
    lines += [
        "",
        f"![ECDFs of s/E per device, recorded and live]({files['ecdf_png'].name})",
        "",
        "KS D is the largest gap between the two empirical CDFs of s/E (numpy, trace_recorder/fidelity_stats.py). "
        "\"D at 5 %\" is the asymptotic two-sample critical value c(0.05) sqrt((n + m) / (n m)): it assumes "
        "independent rounds (a positive lag-1 autocorrelation means fewer independent rounds, so D above it is "
        "weaker evidence than it looks) and a continuous variable (s/E lies on a grid of 1/E, which makes it "
        "conservative).",
        "",
        "What a per-device trace cannot carry, the simulator's iid draws set to zero:",
        "",
        "| | recorded | live | simulated |",
        "|---|---|---|---|",
        f"| mean correlation of s/E between devices in the same round | {_f(corr['recorded'], 2)} | "
        f"{_f(corr['live'], 2)} | 0 (independent draws) |",
        f"| mean lag-1 autocorrelation of a device's s/E | {_f(_nanmean([d.lag1_recorded for d in devs]), 2)} | "
        f"{_f(_nanmean([d.lag1_live for d in devs]), 2)} | 0 (independent draws) |",
        "",
        "## (b) Live accuracy and loss vs simulations replaying the recorded traces",
        "",
        f"![live curves against the simulated band]({files['curves_png'].name})",
        "",
        f"| metric | live inside the {k}-seed band | for independent rounds | live inside a {k - 1}-seed band | "
        f"each simulation inside the others' band | live final | simulated final (min-max) | "
        "mean abs(live - simulated mean) | max abs(live - live s replayed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in curves:
        sc = 100.0 if c.metric == "test_acc" else 1.0
        unit = " pp" if c.metric == "test_acc" else ""
        lines.append(f"| {LABEL[c.metric]} | **{_pct(c.inside_share)}** | {_pct(c.independent_share)} | "
                     f"{_pct(c.live_loo_share)} | {', '.join(_pct(s) for s in c.sim_loo_shares) or 'n/a'} | "
                     f"{sc * c.live_final:.3f} | {sc * c.band_final[0]:.3f}-{sc * c.band_final[1]:.3f} | "
                     f"{sc * c.mean_gap_to_band_mean:.3f}{unit} | {sc * c.replay_max_gap:.4f}{unit} |")
    lines += [
        "",
        "The band is the per-round min-max of the simulations. A live run that were one more draw of the simulation "
        f"would lie inside a {k}-seed band in (K - 1) / (K + 1) = {_pct(exchangeable_inside_share(k))} of rounds if "
        "rounds were independent; curves are autocorrelated, so the reference measured on the simulations "
        "themselves (each against the band of the other K - 1, and live against the same bands) is the fairer one. "
        "The verdict below counts the live curve as consistent when it lies inside those bands at least as often "
        "as the least-inside simulation does. The last column checks the comparison itself: the simulator fed the "
        "live run's own s at its seed must reproduce the live curve (agents and the simulator's row trainer differ "
        "in float rounding only), so a gap between the live curve and the band comes from s alone.",
        "",
        "## Does the loop close?",
        "",
    ]
    lines += verdict(devs, curves, corr, acc)
    lines += ["", f"Data: `{files['devices_csv'].name}` (per device), `{files['curves_csv'].name}` (per round); "
              f"work folder `{fx.get('work', '?')}`.", ""]
    return "\n".join(lines)


def verdict(devs: Sequence[DeviceFigures], curves: Sequence[CurveFigures], corr: dict[str, float],
            acc: CurveFigures) -> list[str]:
    differ = [d for d in devs if d.differs]
    out = []
    if differ:
        out.append(f"- **s: no, for {len(differ)} of {len(devs)} devices.** The live distribution of s/E differs from "
                   "the recorded one beyond the 5 % critical KS distance for "
                   + ", ".join(f"{d.device} (D = {d.ks:.3f} > {d.ks_critical_5pct:.3f}, mean {d.mean_diff:+.3f})"
                               for d in differ) + ".")
    else:
        out.append(f"- **s: yes.** For every device the live distribution of s/E is within the 5 % critical KS "
                   f"distance of its recorded trace (largest D = {max(d.ks for d in devs):.3f}).")
    bad = [c for c in curves if not c.consistent]
    loo = ", ".join(f"{LABEL[c.metric]} {_pct(c.live_loo_share)} vs {_pct(min(c.sim_loo_shares))}-"
                    f"{_pct(max(c.sim_loo_shares))}" for c in curves if c.sim_loo_shares)
    if bad:
        out.append(f"- **Curves: no.** The live curve lies inside the simulated band less often than a simulated "
                   f"curve does ({loo}).")
    else:
        out.append("- **Curves: yes**" + (f": the live curve is inside the simulated band as often as a simulated "
                                          f"curve is ({loo})." if loo else
                                          " (too few seeds for a leave-one-out reference; inside the band in "
                                          f"{_pct(acc.inside_share)} of rounds)."))
    r_rec, r_live = corr["recorded"], corr["live"]
    if any(not math.isnan(r) and r > 0.1 for r in (r_rec, r_live)):
        out.append(f"- **Contention between devices**: s/E of different devices in the same round correlate "
                   f"(mean r = {_f(r_rec, 2)} recorded, {_f(r_live, 2)} live): devices were slowed together, which "
                   "a per-device trace replayed with independent draws cannot reproduce.")
    else:
        out.append(f"- Devices' s/E in the same round hardly correlate (mean r = {_f(r_rec, 2)} recorded, "
                   f"{_f(r_live, 2)} live): no sign of contention between devices that the per-device replay misses.")
    return out


def _opt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _nanmean(values: Sequence[float]) -> float:
    v = [x for x in values if not math.isnan(x)]
    return float(np.mean(v)) if v else math.nan
