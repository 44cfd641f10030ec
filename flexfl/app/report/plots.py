"""The report's figures: matplotlib, each returned as an SVG data URI for an <img> tag.

Figures are built on `matplotlib.figure.Figure` (no pyplot, no global backend switch) and
written as SVG with text kept as text (`svg.fonttype: none`: small and selectable) and a
fixed hash salt and no date (the same data gives the same bytes). Heatmaps are images with
`interpolation="none"`: the SVG then holds one pixel per cell, drawn pixelated by the
browser, so a 100 x 200 heatmap stays a few kB.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import matplotlib as mpl
import numpy as np
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from flexfl.app.report.sections import Cell, DeviceConditions, Participation, StopReasons
from flexfl.vocabulary import StopReason

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

RC: dict[RcKeyType, Any] = {"svg.fonttype": "none", "svg.hashsalt": "flexfl-report", "font.size": 9,
                            "axes.titlesize": 10, "axes.grid": True, "grid.alpha": 0.3,
                            "font.family": ["DejaVu Sans", "sans-serif"]}
SCHEME_STYLE = {"A": ("tab:blue", "-"), "B": ("tab:orange", "--"), "C": ("tab:green", "-"), None: ("tab:green", "-")}
ABSENT_COLOR, INACTIVE_COLOR, REJECTED_COLOR = "#f2f2f2", "#fdae61", "#d7191c"
ARRIVAL_COLOR, DEPARTURE_COLOR = "tab:blue", "tab:red"
# Why a device's s stopped where it did (edge_agent.deadline.StopReason); a reason this report does not know: grey.
REASON_COLORS = {StopReason.COMPLETE: "#2c7bb6", StopReason.COMPUTE: "#fdae61", StopReason.UPLOAD: "#a6611a",
                 StopReason.TRACE: "#abd9e9", StopReason.STOPPED: "#984ea3", StopReason.MISSED: "#d7191c",
                 StopReason.OFFLINE: ABSENT_COLOR, StopReason.UNKNOWN: "#bababa"}
OTHER_REASON_COLOR = "#808080"
# s/E from light to dark blue; the lightest active shade stays well clear of "absent" grey.
S_CMAP = ListedColormap(mpl.colormaps["Blues"](np.linspace(0.3, 1.0, 256)), name="s_over_E")


def svg_uri(fig: Figure) -> str:
    """The figure as a base64 SVG data URI (self-contained: no files, no network)."""
    buf = io.BytesIO()
    with mpl.rc_context(RC):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(width: float, height: float, **kw) -> tuple[Figure, np.ndarray]:
    with mpl.rc_context(RC):
        fig = Figure(figsize=(width, height), layout="constrained")
        axes = fig.subplots(squeeze=False, **kw)
    return fig, axes


def _mark_events(ax, events: list[tuple[int, str, str]], *, label: bool, offset: float = 0.0) -> None:
    """Vertical lines at arrivals and departures; `events` is (round, device, "arrival"/"departure").

    A change noted during round r takes effect when r closes: the evaluation of round r
    already uses the new objective (offset 0 on curves); training changes from round r + 1
    (offset 0.5 on device x round maps: the line sits between the two rounds).
    """
    for rnd, device, what in events:
        color, ls = (ARRIVAL_COLOR, "--") if what == "arrival" else (DEPARTURE_COLOR, ":")
        ax.axvline(rnd + offset, color=color, ls=ls, lw=1.1)
        if label:
            ax.annotate(f"{device} {'arrives' if what == 'arrival' else 'departs'}", xy=(rnd, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(2, -2), textcoords="offset points",
                        rotation=90, va="top", ha="left", fontsize=7, color=color)


Series = dict[str | None, tuple[list[int], list[float | None], list[float | None]]]


def accuracy_loss(series: Series, events: list[tuple[int, str, str]], *,
                  titles: Mapping[str | None, str | None] | None = None) -> str:
    """Test accuracy (fixed 0-100 %) and loss (fixed 0..max) per round, one line per scheme."""
    return svg_uri(accuracy_loss_figure(series, events, titles=titles))


def accuracy_loss_figure(series: Series, events: list[tuple[int, str, str]], *,
                         titles: Mapping[str | None, str | None] | None = None) -> Figure:
    """The figure of `accuracy_loss`: {scheme: (rounds, accuracy 0..1, loss)}, None = not recorded.

    A line's legend is its strategy as `titles` names it ("FedNova", "FedProx (mu = 0.01)"),
    else its label, else "test"."""
    with mpl.rc_context(RC):
        fig, axes = _figure(10, 3.4, ncols=2)
        ax_acc, ax_loss = axes[0]
        loss_max = 0.0
        for scheme, (rounds, acc, loss) in series.items():
            color, ls = SCHEME_STYLE.get(scheme, (None, "-"))
            label = (titles or {}).get(scheme) or scheme or "test"
            x = np.array(rounds)
            a = np.array([math.nan if v is None else 100 * v for v in acc])
            lo = np.array([math.nan if v is None else v for v in loss])
            marker = "o" if len(x) <= 40 else None
            ax_acc.plot(x, a, color=color, ls=ls, marker=marker, ms=3, lw=1.4, label=label)
            ax_loss.plot(x, lo, color=color, ls=ls, marker=marker, ms=3, lw=1.4, label=label)
            if np.isfinite(lo).any():
                loss_max = max(loss_max, float(np.nanmax(lo)))
        ax_acc.set_ylim(0, 100)
        ax_loss.set_ylim(0, loss_max * 1.05 if loss_max > 0 else 1.0)
        ax_acc.set(xlabel="round", ylabel="test accuracy (%)", title="Test accuracy (axis fixed at 0-100 %)")
        ax_loss.set(xlabel="round", ylabel="test loss", title="Test loss (axis from 0)")
        for ax in (ax_acc, ax_loss):
            _mark_events(ax, events, label=ax is ax_acc)
        handles, _labels = ax_acc.get_legend_handles_labels()
        if any(w == "arrival" for _, _, w in events):
            handles.append(mpl.lines.Line2D([], [], color=ARRIVAL_COLOR, ls="--",
                                            label="arrival (takes effect next round)"))
        if any(w == "departure" for _, _, w in events):
            handles.append(mpl.lines.Line2D([], [], color=DEPARTURE_COLOR, ls=":", label="departure"))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


def accuracy_time(series: Mapping[str | None, tuple[list[float], list[float | None]]], *, clock: str,
                  titles: Mapping[str | None, str | None] | None = None) -> str:
    """Test accuracy (0-100 %) against seconds, one line per variant: {variant: (seconds, accuracy 0..1)}; `clock`
    "simulated" or "wall" names the axis."""
    with mpl.rc_context(RC):
        fig, axes = _figure(6, 3.4)
        ax = axes[0][0]
        for scheme, (seconds, acc) in series.items():
            color, ls = SCHEME_STYLE.get(scheme, (None, "-"))
            a = np.array([math.nan if v is None else 100 * v for v in acc])
            ax.plot(seconds, a, color=color, ls=ls, marker="o" if len(a) <= 40 else None, ms=3, lw=1.4,
                    label=(titles or {}).get(scheme) or scheme or "test")
        ax.set_ylim(0, 100)
        what = "simulated seconds (the clock of simulator/clock.py)" if clock == "simulated" else \
            "seconds since the first round opened (wall clock)"
        ax.set(xlabel=what, ylabel="test accuracy (%)", title="Test accuracy against time")
        fig.legend(loc="outside lower center", ncols=max(1, len(series)), fontsize=8, frameon=False)
    return svg_uri(fig)


def _device_axis(ax, devices: list[str], rounds: list[int]) -> None:
    step = max(1, math.ceil(len(devices) / 40))
    ax.set_yticks(range(0, len(devices), step), devices[::step], fontsize=7 if len(devices) > 12 else 8)
    ax.set_xlabel("round")
    ax.grid(False)


def _extent(rounds: list[int], n_devices: int) -> tuple[float, float, float, float]:
    lo, hi = (rounds[0], rounds[-1]) if rounds else (0, 0)
    return (lo - 0.5, hi + 0.5, n_devices - 0.5, -0.5)


def _heatmap_height(n_devices: int) -> float:
    return min(14.0, 1.4 + 0.24 * n_devices)


def participation_heatmap(part: Participation, events: list[tuple[int, str, str]]) -> str:
    """Device x round: s/E in blues; inactive, rejected and absent in their own colours; x = a rejection."""
    with mpl.rc_context(RC):
        fig, axes = _figure(10, _heatmap_height(len(part.devices)))
        ax = axes[0, 0]
        rgba = np.zeros((*part.state.shape, 4))
        rgba[part.state == Cell.ABSENT] = to_rgba(ABSENT_COLOR)
        rgba[part.state == Cell.INACTIVE] = to_rgba(INACTIVE_COLOR)
        rgba[part.state == Cell.REJECTED] = to_rgba(REJECTED_COLOR)
        active = part.state == Cell.ACTIVE
        rgba[active] = S_CMAP(np.clip(part.fraction[active], 0, 1))
        ax.imshow(rgba, aspect="auto", interpolation="none", extent=_extent(part.rounds, len(part.devices)))
        ys, xs = np.nonzero(part.rejected_any)
        if len(xs):
            ax.scatter(np.array(part.rounds)[xs], ys, marker="x", s=22, color="black", lw=1.2, zorder=3)
        _device_axis(ax, part.devices, part.rounds)
        _mark_events(ax, events, label=False, offset=0.5)
        scale = part.scale.split(" ")[0] if "unknown" not in part.scale else "max s"
        ax.set_title(f"Participation: s / {scale} per device and round")
        sm = mpl.cm.ScalarMappable(norm=mpl.colors.Normalize(0, 1), cmap=S_CMAP)
        fig.colorbar(sm, ax=ax, label=f"s / {part.scale}", fraction=0.04, pad=0.01)
        legend = [Patch(color=ABSENT_COLOR, label="absent (not a participant)"),
                  Patch(color=INACTIVE_COLOR, label="inactive (s = 0)"),
                  Patch(color=REJECTED_COLOR, label="rejected, s = 0"),
                  mpl.lines.Line2D([], [], marker="x", color="black", ls="", label="a rejected update")]
        fig.legend(handles=legend, loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    return svg_uri(fig)


def stop_reason_map(sr: StopReasons | None, events: list[tuple[int, str, str]],
                    conditions: DeviceConditions | None = None) -> str:
    """Device x round coloured by why s stopped there (s written in each cell while the grid is small enough to
    read); with `conditions`, below it and on the same axes the CPU share, upload and download rates the emulated
    fleet applied (offline in grey)."""
    panels = (sr is not None) + 3 * (conditions is not None)
    n_devices = len(sr.devices if sr is not None else conditions.devices if conditions is not None else [])
    with mpl.rc_context(RC):
        fig, axes = _figure(10, panels * _heatmap_height(n_devices) - (panels - 1) * 0.4, nrows=panels, sharex=True)
        column = list(axes[:, 0])
        legend = []
        if sr is not None:
            legend += _draw_stop_reasons(column.pop(0), sr, events)
            if conditions is not None:  # the condition panels have colour bars: keep this one's width equal
                spacer = fig.colorbar(mpl.cm.ScalarMappable(), ax=axes[0, 0], fraction=0.04, pad=0.01)
                spacer.ax.set_visible(False)
        if conditions is not None:
            legend += _draw_conditions(fig, column, conditions, events)
        fig.legend(handles=legend, loc="outside lower center", ncols=min(len(legend), 5), fontsize=8, frameon=False)
    return svg_uri(fig)


def _draw_stop_reasons(ax, sr: StopReasons, events: list[tuple[int, str, str]]) -> list:
    rgba = np.zeros((*sr.reason.shape, 4))
    rgba[:] = to_rgba("white")
    seen = []
    for why in dict.fromkeys(v for v in sr.reason.flat if v):
        rgba[sr.reason == why] = to_rgba(REASON_COLORS.get(why, OTHER_REASON_COLOR))
        seen.append(why)
    ax.imshow(rgba, aspect="auto", interpolation="none", extent=_extent(sr.rounds, len(sr.devices)))
    write = len(sr.devices) <= 12 and len(sr.rounds) <= 40
    if write:
        for i, j in zip(*np.nonzero(sr.s >= 0)):
            dark = sr.reason[i, j] in (StopReason.COMPLETE, StopReason.UPLOAD, StopReason.MISSED, StopReason.STOPPED)
            ax.text(sr.rounds[j], i, str(sr.s[i, j]), ha="center", va="center", fontsize=6,
                    color="white" if dark else "black")
    _device_axis(ax, sr.devices, sr.rounds)
    _mark_events(ax, events, label=False, offset=0.5)
    ax.set_title("Why each device's s stopped where it did" + (" (the number: s)" if write else ""))
    order = [m.value for m in StopReason] + sorted(set(seen) - {m.value for m in StopReason})
    return [Patch(facecolor=REASON_COLORS.get(why, OTHER_REASON_COLOR), edgecolor="#999999", label=why)
            for why in order if why in seen]


def _rate_text(kbit: float) -> str:
    """A rate for a cell: 800k, 8M, 100M (kbit/s and Mbit/s, as tc writes them)."""
    return f"{kbit / 1000:.3g}M" if kbit >= 1000 else f"{kbit:.3g}k"


def _log_norm(values: np.ndarray) -> mpl.colors.Normalize:
    finite = values[np.isfinite(values) & (values > 0)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (1.0, 10.0)
    return mpl.colors.LogNorm(lo, hi if hi > lo else lo * 10)


def _draw_conditions(fig: Figure, axes: list, dc: DeviceConditions, events: list[tuple[int, str, str]]) -> list:
    """The CPU share, upload and download panels of stop_reason_map; offline cells grey and marked "off"."""
    offline = dc.online == 0
    write = len(dc.devices) <= 12 and len(dc.rounds) <= 40
    panels = (("applied CPU share (of the device's full compute)", dc.cpu_share, S_CMAP, mpl.colors.Normalize(0, 1),
               lambda v: f"{v:.2g}"),
              ("applied upload, kbit/s (log colour scale)", dc.up_kbit, mpl.colormaps["Purples"], _log_norm(dc.up_kbit),
               _rate_text),
              ("applied download, kbit/s (log colour scale)", dc.down_kbit, mpl.colormaps["Greens"],
               _log_norm(dc.down_kbit), _rate_text))
    for ax, (title, values, cmap, norm, text) in zip(axes, panels):
        shown = np.where(offline, np.nan, values)
        im = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", interpolation="none", cmap=cmap, norm=norm,
                       extent=_extent(dc.rounds, len(dc.devices)))
        grey = np.zeros((*values.shape, 4))
        grey[offline] = to_rgba(ABSENT_COLOR)
        ax.imshow(grey, aspect="auto", interpolation="none", extent=_extent(dc.rounds, len(dc.devices)))
        if write:
            for i, j in zip(*np.nonzero(offline | np.isfinite(shown))):
                dark = not offline[i, j] and norm(shown[i, j]) > 0.6
                ax.text(dc.rounds[j], i, "off" if offline[i, j] else text(shown[i, j]), ha="center", va="center",
                        fontsize=6, color="white" if dark else "black")
        _device_axis(ax, dc.devices, dc.rounds)
        _mark_events(ax, events, label=False, offset=0.5)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01)
    return [Patch(facecolor=ABSENT_COLOR, edgecolor="#999999", label="offline: link down"),
            Patch(facecolor="white", edgecolor="#999999", label="no conditions recorded")]


def coefficient_heatmap(devices: list[str], rounds: list[int], coef: np.ndarray, discarded: list[int]) -> str:
    """Device x round aggregation coefficient; grey where the device is not in the objective."""
    with mpl.rc_context(RC):
        fig, axes = _figure(10, _heatmap_height(len(devices)))
        ax = axes[0, 0]
        cmap = mpl.colormaps["viridis"].with_extremes(bad=ABSENT_COLOR)
        finite = coef[np.isfinite(coef)]
        vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        im = ax.imshow(np.ma.masked_invalid(coef), aspect="auto", interpolation="none", cmap=cmap, vmin=0, vmax=vmax,
                       extent=_extent(rounds, len(devices)))
        for rnd in discarded:
            ax.axvspan(rnd - 0.5, rnd + 0.5, fill=False, hatch="///", edgecolor=REJECTED_COLOR, lw=0)
        _device_axis(ax, devices, rounds)
        ax.set_title("Aggregation coefficient per device and round (grey: not in the objective"
                     + ("; hatched: round discarded)" if discarded else ")"))
        fig.colorbar(im, ax=ax, label="coefficient", fraction=0.04, pad=0.01)
    return svg_uri(fig)


def _byte_unit(largest: float) -> tuple[str, float]:
    for unit, size in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if largest >= size:
            return unit, size
    return "bytes", 1.0


def traffic_plot(t: dict[str, list[float]]) -> str:
    """Bytes out (models) and in (updates) per round, in the unit that fits the largest bar."""
    with mpl.rc_context(RC):
        fig, axes = _figure(10, 2.8)
        ax = axes[0, 0]
        x = np.array(t["round"], dtype=float)
        unit, size = _byte_unit(max(t["bytes_out"] + t["bytes_in"]))
        w = 0.4
        ax.bar(x - w / 2, np.array(t["bytes_out"]) / size, width=w, color="tab:purple", label="out: models sent")
        ax.bar(x + w / 2, np.array(t["bytes_in"]) / size, width=w, color="tab:cyan", label="in: updates received")
        ax.set(xlabel="round", ylabel=unit, title="Traffic per round (all devices)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return svg_uri(fig)


def durations_plot(d: dict[str, list], deadline_s: float | None) -> str:
    """Round duration (open to close) and aggregation + evaluation, against the deadline;
    dots: each update's arrival after its model's delivery."""
    with mpl.rc_context(RC):
        fig, axes = _figure(10, 3.0)
        ax = axes[0, 0]
        x = np.array(d["round"], dtype=float)
        round_s = np.array(d["round_s"])
        colors = ["tab:green" if r == "all answered" else "tab:orange" for r in d["close_reason"]]
        ax.bar(x, round_s, width=0.7, color=colors)
        ax.bar(x, np.nan_to_num(np.array(d["aggregate_eval_s"])), width=0.7, bottom=np.nan_to_num(round_s),
               color="tab:gray", alpha=0.7)
        if d["arrivals"]:
            ax.scatter([r for r, _ in d["arrivals"]], [v for _, v in d["arrivals"]], s=8, color="black", zorder=3)
        handles = [Patch(color="tab:green", label="round closed: all answered"),
                   Patch(color="tab:orange", label="round closed: deadline"),
                   Patch(color="tab:gray", alpha=0.7, label="aggregation + evaluation"),
                   mpl.lines.Line2D([], [], marker="o", ms=3, color="black", ls="",
                                    label="an update's arrival after delivery")]
        if deadline_s is not None:
            ax.axhline(deadline_s, color="tab:red", ls="--", lw=1.2)
            handles.append(mpl.lines.Line2D([], [], color="tab:red", ls="--", label=f"deadline {deadline_s:g} s"))
        ax.set(xlabel="round", ylabel="seconds", title="Round duration against the deadline")
        ax.set_ylim(bottom=0)
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return svg_uri(fig)


# ---- sweeps -------------------------------------------------------------------------------


def sweep_improvements(dataset: str, table, *, title: str | None = None) -> str:
    """% improvement per |T| (B over A, C over B): ours (mean, min-max over seeds) beside the paper's."""
    from simulator.paper_numbers import PAPER_TABLE3

    name = title or dataset.upper()
    with mpl.rc_context(RC):
        fig, axes = _figure(10, 2.8 * len(table.settings), nrows=len(table.settings), ncols=2)
        for row, setting in enumerate(table.settings):
            paper = PAPER_TABLE3.get((dataset, setting), [])
            for col, comparison in enumerate(("B over A", "C over B")):
                ax = axes[row, col]
                js = [j for j in table.num_traces if (setting, j) in table.ours_values]
                vals = [table.ours_values[(setting, j)][col] for j in js]
                mean = np.array([np.mean(v) for v in vals])
                lo = mean - np.array([np.min(v) for v in vals])
                hi = np.array([np.max(v) for v in vals]) - mean
                ax.errorbar(js, mean, yerr=[lo, hi], fmt="o-", color="tab:green", capsize=3,
                            label="FlexFL (min-max over seeds)")
                if paper:
                    ax.plot(range(1, len(paper) + 1), [p[col] for p in paper], "s--", color="tab:gray", label="paper")
                ax.axhline(0, color="black", lw=0.6)
                ax.set(xlabel="|T|", ylabel="% improvement", title=f"{name} {setting.upper()}: {comparison}")
                ax.set_xticks(table.num_traces)
                ax.legend(fontsize=7)
    return svg_uri(fig)


def sweep_cells(dataset: str, setting: str, curves: dict[int, dict[str, np.ndarray]], *,
                title: str | None = None) -> str:
    """One panel per |T|: test accuracy per round of Schemes A/B/C, mean over seeds with the min-max band."""
    with mpl.rc_context(RC):
        cols = min(4, len(curves))
        rows = math.ceil(len(curves) / cols)
        fig, axes = _figure(10, 2.4 * rows, nrows=rows, ncols=cols, sharey=True)
        for ax, (j, by_scheme) in zip(axes.flat, curves.items()):
            for scheme, runs in by_scheme.items():
                color, ls = SCHEME_STYLE.get(scheme, (None, "-"))
                x = np.arange(1, runs.shape[1] + 1)
                seeds = f"{len(runs)} seed{'s' if len(runs) > 1 else ''}"
                ax.plot(x, 100 * runs.mean(axis=0), color=color, ls=ls, lw=1.2, label=f"{scheme} ({seeds})")
                if len(runs) > 1:
                    ax.fill_between(x, 100 * runs.min(axis=0), 100 * runs.max(axis=0), color=color, alpha=0.15, lw=0)
            ax.set_ylim(0, 100)
            ax.set(title=f"|T| = {j}", xlabel="round")
        for ax in axes[:, 0]:
            ax.set_ylabel("test accuracy (%)")
        for ax in list(axes.flat)[len(curves):]:
            ax.set_visible(False)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
        fig.suptitle(f"{title or dataset.upper()} {setting.upper()}: "
                     "test accuracy per round (mean, band: min-max over seeds)")
    return svg_uri(fig)


# ---- trace sets ---------------------------------------------------------------------------


def trace_figure(trace, resolution: int | None) -> str:
    """One trace: fraction per round (time series) and its distribution (histogram)."""
    with mpl.rc_context(RC):
        fig, axes = _figure(10, 1.9, ncols=2, width_ratios=[3, 1])
        ax_t, ax_h = axes[0]
        frac = np.asarray(trace.fraction)
        ax_t.plot(trace.round, 100 * frac, lw=0.8, color="tab:blue")
        zeros = frac == 0
        if zeros.any():
            ax_t.scatter(trace.round[zeros], np.zeros(zeros.sum()), s=10, color=REJECTED_COLOR, zorder=3,
                         label="inactive (0)")
            ax_t.legend(fontsize=7, loc="lower left")
        ax_t.set_ylim(-3, 103)
        ax_t.set(xlabel="round", ylabel="% of E", title=f"{trace.name}: per round")
        # One bin per grid step when the fractions sit on a grid (k / R), else 20 bins.
        bins = np.linspace(-0.5 / resolution, 1 + 0.5 / resolution, resolution + 2) if resolution else 20
        ax_h.hist(frac, bins=bins, color="tab:blue", edgecolor="white", lw=0.3)
        ax_h.set(xlabel="fraction of E", ylabel="rounds", title="distribution")
        ax_h.set_xlim(-0.05, 1.05)
    return svg_uri(fig)


def campaign_curves(curves: list[tuple[str, str, list[int], list[float]]]) -> str:
    """Test accuracy per round of every run of a campaign: (group, run, rounds, accuracies); one colour per group."""
    fig, axes = _figure(7.0, 3.6)
    ax = axes[0, 0]
    colors = {group: f"C{i % 10}" for i, group in enumerate(dict.fromkeys(g for g, *_ in curves))}
    labelled: set[str] = set()
    for group, _run, rounds, acc in curves:
        ax.plot(rounds, [100 * a for a in acc], color=colors[group], lw=1.2, alpha=0.8,
                label=None if group in labelled else group)
        labelled.add(group)
    ax.set_ylim(0, 100)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="lower right", fontsize=8)
    return svg_uri(fig)
