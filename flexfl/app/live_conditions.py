"""`flexfl live --emulate --timeline FILE`: the emulated fleet follows a device timeline, and the run records it.

What a timeline's columns do on the fleet: loadgen.fleet_timeline. When they apply:
- a round-clocked timeline (start_round) gives round r's conditions when the coordinator opens
  round r, and they hold until round r + 1 opens;
- a second-clocked one (start_s) is read by wall clock from round 1's opening (t = 0 there, as
  the simulator reads round 1 at 0 s), so its conditions may change inside a round.
The driver learns the open round from the coordinator's Status (open_round), polled every
POLL_S: conditions come into force a poll or so after the opening, while the device is being
handed its model (the coordinator knows nothing of the emulation and does not wait for it).
A device that has not joined yet (the late arrival) runs unlimited and gets its conditions once
it has: start-up is not what a run is about.

The record: RUN/conditions.jsonl, one JSON line per round at its opening, and for a
second-clocked timeline one more whenever conditions change inside the round:
{"round": r, "time": unix s, "t_s": s since round 1 opened, "devices": {id: Settings.record()}}
(devices not joined yet are left out). Lines are appended and fsynced one by one
(coordinator.metrics.MetricsWriter); loadgen.fleet_timeline.read_conditions is the reader.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.metrics import MetricsWriter
from coordinator.rules.round_record import RoundRecord
from loadgen.fleet_timeline import CONDITIONS_FILE, POLL_S, Change, Fleet, FleetTimeline
from trace_recorder.timeline import TimeUnit, read_timeline

log = logging.getLogger(__name__)



def fleet_timeline(path: Path, full_cpus: list[float | None], *, least_cpus: float) -> FleetTimeline:
    """Read timeline `path` for a fleet whose devices have `full_cpus` each; warn where it asks for less than the
    fleet can set. Errors (file, devices) are one line naming the file."""
    timeline = read_timeline(path)
    ft = FleetTimeline(timeline, full_cpus=full_cpus, least_cpus=least_cpus, where=str(path))
    from loadgen.fleet_timeline import clamp_warnings

    for line in clamp_warnings(timeline, full_cpus, least_cpus=least_cpus, where=str(path)):
        log.warning("%s", line)
    return ft


class LiveTimeline:
    """Plays a FleetTimeline on a running fleet by the coordinator's rounds, and records conditions.jsonl."""

    def __init__(self, timeline: FleetTimeline, fleet: Fleet, *, out: Path,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeline, self.fleet, self.clock = timeline, fleet, clock
        self.writer = MetricsWriter(Path(out) / CONDITIONS_FILE, append=False)
        self.joined: set[int] = set()
        self.round = 0  # the open round last seen (0: none yet)
        self.started: float | None = None  # clock() when round 1 was seen open

    @property
    def unit(self) -> TimeUnit:
        return self.timeline.timeline.unit

    def follow(self, status: Any) -> list[Change]:
        """Apply what is due, given the coordinator's StatusReply (None while it does not answer); returns it."""
        if status is None:
            return []
        names = self.timeline.names
        connected = {d.device_id for d in status.devices if d.connected}
        joined = {i for i, name in enumerate(names) if name in connected}
        opened = status.open_round if status.open_round and status.open_round != self.round else 0
        if self.started is None:
            if not opened:
                return []  # before round 1 nothing applies
            self.started = self.clock()
        if opened:
            if self.round and opened > self.round + 1:
                log.warning("rounds %d..%d were open for less than a poll (%g s): their conditions were not applied",
                            self.round + 1, opened - 1, POLL_S)
            self.round = opened
        newcomers = joined - self.joined
        self.joined |= joined
        t = self.round if self.unit is TimeUnit.ROUND else self.clock() - self.started
        if not opened and not newcomers and self.unit is TimeUnit.ROUND:
            return []
        done = self.timeline.apply(self.fleet, t, devices=sorted(self.joined))
        if opened or done:
            self._record()
        return done

    def _record(self) -> None:
        assert self.started is not None
        in_force = self.timeline.in_force
        self.writer.write({"round": self.round, "time": time.time(), "t_s": self.clock() - self.started,
                           "devices": {self.timeline.names[i]: in_force[self.timeline.names[i]].record()
                                       for i in sorted(self.joined)}})

    def close(self) -> None:
        self.writer.close()


def update_s_at_full_share(rows: list[RoundRecord], applied: dict[int, dict[str, dict[str, Any]]]) -> dict | None:
    """What one local update cost at cpu_share 1 in a timeline run: `flexfl sim run --timeline`'s --update-s.

    Per device and round with s > 0: train_s / s (the agent's own timing) x the cpu_share in force,
    which is the cost at share 1 where the quota throttles in proportion; the median over those
    device-rounds, and how many there were. None without any. Unthrottled devices (share 1 and no
    quota) run at whatever the host gives them beside the others: the figure then includes that
    contention."""
    costs = []
    for row in rows:
        in_force = applied.get(row.round, {})
        measured = row.live.train_s if row.live is not None else {}
        for d, s in row.s.items():
            train_s, settings = measured.get(d), in_force.get(d)
            if s > 0 and train_s and settings and settings["online"] and settings["cpu_share"] > 0:
                costs.append(train_s / s * settings["cpu_share"])
    if not costs:
        return None
    costs.sort()
    return {"update_s": costs[len(costs) // 2], "device_rounds": len(costs)}
