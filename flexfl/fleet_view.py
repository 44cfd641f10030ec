"""A coordinator's status (flexfl.exchange.FleetState) as text lines and as JSON: `flexfl status`, a campaign's view.

The lines: one for the run, one for its round, then a table with one row per device: its state
now, its last closed round (s / E and why it stopped there, the bytes of its update and of the
model sent), its resident memory and its link as it reported them, and how long ago it called.
A dash stands for what is not known (not reported, not measured, or a coordinator too old to say).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from flexfl.exchange import DeviceState, FleetState

COLUMNS = ("device", "shard", "state", "round", "s/E", "stop", "in", "out", "RSS", "link", "seen")
_RIGHT = {"shard", "round", "s/E", "in", "out", "RSS", "link", "seen"}  # numbers: aligned right
_NONE = "-"


def render(state: FleetState, *, address: str) -> list[str]:
    """The status as lines of text (no trailing newlines): the run, the round, a table of the devices."""
    rows = [_device_row(d, E=state.required_updates) for d in state.devices]
    return [_run_line(state, address=address), _round_line(state), *_table(rows)]


def device_state(d: DeviceState) -> str:
    """One word for what a device is doing: its part in the open round, else whether it waits for one."""
    if d.departed:
        return "departed"
    if d.round_state:
        return str(d.round_state)
    if not d.in_objective:
        return "arriving"  # joined; enters the objective when the round closes
    if d.streaming:
        return "waiting"  # connected, waiting for a round that includes it
    return "away" if d.connected else "not seen"


def state_json(state: FleetState) -> dict[str, Any]:
    """The status as a JSON object: the record's fields, with the partition as an object rather than a string."""
    out = asdict(state)
    text = out.pop("partition_json")
    out["partition"] = json.loads(text) if text else None
    for d in out["devices"]:
        d["round_state"] = str(d["round_state"])
    return out


def _run_line(state: FleetState, *, address: str) -> str:
    terms = []
    if state.required_updates:
        terms.append(f"E = {state.required_updates}")
    if state.deadline_s:
        terms.append(f"deadline {state.deadline_s:g} s")
    joined = len(state.devices)
    return " | ".join([f"coordinator {address}", f"run {state.run_id}", *terms,
                       f"{joined} device{'' if joined == 1 else 's'}"])


def _round_line(state: FleetState) -> str:
    if state.finished:
        return f"finished: {state.completed_round} of {state.rounds} rounds"
    if not state.started and state.completed_round == 0:
        return "not started: waiting for devices"
    if not state.open_round:
        return f"between rounds: {state.completed_round} of {state.rounds} done"
    line = f"round {state.open_round} of {state.rounds} open"
    if state.round_open_s is not None:
        line += f" for {state.round_open_s:.1f} s"
    if state.round_closes_in_s is not None:
        line += f", closes in {state.round_closes_in_s:.1f} s" if state.round_closes_in_s > 0 else ", closing"
    taking_part = [d for d in state.devices if d.round_state]
    if taking_part:
        answered = sum(d.round_state in ("answered", "left") for d in taking_part)
        line += f"; {answered} of {len(taking_part)} answered"
    return line


def _device_row(d: DeviceState, *, E: int) -> dict[str, str]:
    r = d.last_round
    return {
        "device": d.device_id, "shard": _NONE if d.shard_index is None else str(d.shard_index),
        "state": device_state(d), "round": str(r.round_id) if r else _NONE,
        "s/E": (f"{r.s}/{E}" if E else str(r.s)) if r else _NONE, "stop": r.stop_reason if r else _NONE,
        "in": _bytes(r.bytes_in) if r else _NONE, "out": _bytes(r.bytes_out) if r else _NONE,
        "RSS": f"{d.resident_bytes / 2**20:.0f} MiB" if d.resident_bytes else _NONE,
        "link": f"{d.upload_bytes_per_s * 8 / 1e6:.3g} Mbit/s" if d.upload_bytes_per_s else _NONE,
        "seen": f"{d.seen_ago_s:.1f} s" if d.seen_ago_s is not None else _NONE,
    }


def _bytes(n: int) -> str:
    if not n:
        return _NONE
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _table(rows: list[dict[str, str]]) -> list[str]:
    widths = {c: max([len(c), *(len(row[c]) for row in rows)]) for c in COLUMNS}

    def line(cells: dict[str, str]) -> str:
        return "  ".join(cells[c].rjust(widths[c]) if c in _RIGHT else cells[c].ljust(widths[c])
                         for c in COLUMNS).rstrip()

    return [line({c: c for c in COLUMNS}), *(line(row) for row in rows)]
