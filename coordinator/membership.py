"""Who trains in the live fleet: joins, leaves and reconnections, and the events waiting for a close.

The registry (coordinator/registry.py) records who joined with what data; this module
decides what a join or a leave means for training. Before training begins, a device founds
the objective at once (Federation.apply_events); after, an arrival or a departure waits for
the close of the round it happened in (take_events), so a round's objective never changes
under it. A device that joins while the founding window is open (run.founding_rounds) founds
the objective at the next close rather than arriving. Departures and returns are journaled
(coordinator/resume.py): the device will not announce them again after a crash.

Not thread-safe by itself: the round engine holds its lock around every call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from coordinator.config import CoordinatorConfig, OnEmpty
from coordinator.open_round import OpenRound
from coordinator.registry import DeviceRecord, Registry
from coordinator.resume import append_event
from coordinator.rules.round import Arrival, Departure, Federation
from flexfl.errors import ConfigError, PartitionMismatch, UnknownDevice
from flexfl.exchange import DeviceState, Join
from workloads.partition_spec import PartitionSpec

log = logging.getLogger(__name__)


class Membership:
    def __init__(self, cfg: CoordinatorConfig, *, federation: Federation, shard_samples: Sequence[int] | np.ndarray,
                 events_path: Path) -> None:
        self.cfg = cfg
        self.federation = federation
        self.shard_samples = shard_samples  # samples per shard of the partition
        self.events_path = events_path
        self.registry = Registry()
        self.seen: set[str] = set()  # devices that called in since this process started
        self.pending_arrivals: list[str] = []
        self.pending_departures: list[str] = []
        self.founding: set[str] = set()  # pending arrivals that joined in the founding window
        self.ended_empty = False  # run.on_empty = stop ended the run: no device was left

    # ---- joins ---------------------------------------------------------------------------

    def admit(self, join: Join) -> int:
        """Check a join's partition and data against the coordinator's; returns its sample count.

        Reads nothing that changes: callable without the engine's lock.
        """
        device_id, shard, reported = join.device_id, join.shard_index, join.sample_count
        if join.partition_json:  # else the agent adopts ours
            ours = self.cfg.partition
            theirs = PartitionSpec.from_json(join.partition_json, where=f"device {device_id!r}", ours=ours)
            if theirs != ours:
                raise PartitionMismatch(
                    f"device {device_id!r} has partition [{theirs.describe()}] but the coordinator trains on "
                    f"[{ours.describe()}]; differences (device vs coordinator): " + "; ".join(theirs.differences(ours)))
        if shard is None:
            if reported < 1:
                raise ConfigError(f"device {device_id!r}: sample_count must be >= 1, got {reported}")
            return int(reported)
        counts = self.shard_samples
        if shard >= len(counts):
            raise ConfigError(f"device {device_id!r}: shard_index {shard} is outside the partition's "
                              f"0..{len(counts) - 1}")
        n = int(counts[shard])
        if reported not in (0, n):  # 0: the device does not hold data (benchmark agents)
            raise PartitionMismatch(f"device {device_id!r} holds {reported} samples, but shard {shard} of "
                                    f"[{self.cfg.partition.describe()}] has {n}")
        return n

    def join(self, join: Join, *, n_samples: int, training_begun: bool) -> tuple[DeviceRecord, bool]:
        """Register a join (admitted with `n_samples`); returns the device's record and whether it is an arrival."""
        device_id, shard = join.device_id, join.shard_index
        fed = self.federation
        record = self.registry.get(device_id)
        arrival = False
        self.registry.check_claim(device_id, shard, n_samples)
        if record is None:
            record = self.registry.add(device_id, sample_count=n_samples, hardware=dict(join.hardware),
                                       agent_version=join.agent_version, after_round=fed.completed_round,
                                       shard_index=shard)
            if training_begun:
                arrival = not self._founding_window_open(device_id)
                if not arrival:
                    self.founding.add(device_id)
                self.pending_arrivals.append(device_id)
            else:
                fed.apply_events(arrivals=[Arrival(device_id, n_samples)])
            log.info("device %s joined (shard %s, %d samples, %.0f MiB resident)%s", device_id, shard, n_samples,
                     join.resident_bytes / 2**20, " as an arrival" if arrival else
                     " in the founding rounds (run.founding_rounds): a member from the next close"
                     if device_id in self.founding else "")
        elif record.departed:
            # A departed device that comes back: an arrival (excluded) or back in training (included).
            record.departed = False
            record.sample_count = n_samples
            record.joined_after_round = fed.completed_round
            self._journal("rejoin", device_id)
            if device_id in self.pending_departures:
                self.pending_departures.remove(device_id)
            elif training_begun:
                arrival = device_id not in fed.objective.sample_counts
                self.pending_arrivals.append(device_id)
            else:
                fed.apply_events(arrivals=[Arrival(device_id, n_samples)])
            log.info("device %s rejoined after departing", device_id)
        else:
            log.info("device %s reconnected", device_id)
        record.last_seen = time.time()
        record.hardware = dict(join.hardware) or record.hardware
        record.resident_bytes = int(join.resident_bytes)
        self.seen.add(device_id)
        return record, arrival

    def _founding_window_open(self, device_id: str) -> bool:
        """A device joining now founds the objective rather than arriving (run.founding_rounds)."""
        run = self.cfg.run
        return self.federation.completed_round < run.founding_rounds and device_id not in run.expected_arrivals

    def known(self, device_id: str) -> DeviceRecord:
        record = self.registry.get(device_id)
        if record is None:
            raise UnknownDevice(f"unknown device {device_id!r}: call Join first")
        return record

    @staticmethod
    def seed_index(record: DeviceRecord) -> int:
        # The simulator seeds device k's streams with k = its shard: so does a live device.
        return record.shard_index if record.shard_index is not None else record.index

    # ---- leaves --------------------------------------------------------------------------

    def leave(self, device_id: str, reason: str, *, training_begun: bool) -> bool:
        """An announced departure; True when the device had not departed already."""
        record = self.known(device_id)
        if record.departed:
            return False
        record.departed = True
        self._journal("leave", device_id)
        if training_begun:
            self.pending_departures.append(device_id)
        else:
            self.federation.apply_events(departures=[Departure(device_id)])
        log.info("device %s announced departure (%s); policy %s", device_id, reason or "no reason",
                 self.cfg.rules.departure_policy)
        return True

    def _journal(self, event: str, device_id: str) -> None:
        append_event(self.events_path, event=event, device_id=device_id, after_round=self.federation.completed_round)

    # ---- at a close ----------------------------------------------------------------------

    def take_events(self) -> tuple[list[Arrival], list[Departure]]:
        """The pending arrivals and departures as events for the close (or the pause), which clears them."""
        arrivals = [Arrival(d, self.registry.record(d).sample_count, founding=d in self.founding)
                    for d in self.pending_arrivals]
        departures = [Departure(d) for d in self.pending_departures]
        self.pending_arrivals.clear()
        self.pending_departures.clear()
        self.founding.clear()
        return arrivals, departures

    def scripted_events_due(self, r: OpenRound, *, now: float) -> bool:
        """True while a device scripted to arrive in (or depart after) round r has not done so yet.

        run.expected_arrivals / expected_departures make scripted experiments exact: the round
        is held open for them at most run.expected_wait_s, then closes with an error logged.
        """
        run, tau = self.cfg.run, r.round_id
        due = [d for d, rnd in run.expected_arrivals.items() if rnd == tau and self.registry.get(d) is None]
        # A departure is awaited only from a device that uploaded (it leaves right after); a
        # dead device is not waited for.
        due += [d for d, rnd in run.expected_departures.items()
                if rnd == tau and d in r.updates and not self.registry.record(d).departed]
        if not due:
            return False
        if now < r.opened_at + run.expected_wait_s:
            return True
        if not r.gave_up_waiting:
            r.gave_up_waiting = True
            log.error("round %d: scripted arrival/departure of %s did not happen within run.expected_wait_s = %g s; "
                      "closing the round without it", tau, ", ".join(sorted(due)), run.expected_wait_s)
        return False

    # ---- before a round: enough devices to start, any left to train ------------------------

    def wait_for_start(self, cond: threading.Condition, stop: threading.Event) -> bool:
        """Wait (holding `cond`, the engine's) until training may start; False when stopped first.

        A fresh run starts once run.min_devices have joined and run.start_grace_s has passed
        since; a resumed one once that many (of those not departed) have called in again, or
        after run.resume_wait_s.
        """
        run = self.cfg.run
        if self.federation.completed_round > 0:  # resumed: give the fleet a moment to reconnect
            active = self.active()
            need = min(run.min_devices, len(active))
            if not self.federation.objective.active_members():
                need = max(need, 1)  # every device had left: wait for one here, not in wait_for_members
            limit = time.monotonic() + run.resume_wait_s
            while not stop.is_set() and len(self.seen) < need and time.monotonic() < limit:
                cond.wait(timeout=0.05)
            log.info("resuming at round %d with %d of %d devices back", self.federation.completed_round + 1,
                     len(self.seen), len(active))
            return not stop.is_set()
        ready_since = None
        while not stop.is_set():
            active = self.active()
            if len(active) >= run.min_devices:
                ready_since = ready_since or time.monotonic()
                if time.monotonic() - ready_since >= run.start_grace_s:
                    log.info("starting training with %d device%s", len(active), "" if len(active) == 1 else "s")
                    return True
            cond.wait(timeout=0.05)
        return False

    def wait_for_members(self, cond: threading.Condition, stop: threading.Event) -> bool:
        """Every device has left (no round can run): wait (holding `cond`) until one joins; False when
        the run ends instead (stopped, or run.on_empty = stop: ended_empty).

        Under run.on_empty = wait the run pauses before the next round, and a device that joins
        (or comes back) enters the objective at once, as an arrival after the last closed round.
        """
        fed = self.federation
        tau = fed.completed_round + 1
        warned = False
        while not stop.is_set():
            # Joined (or came back) since the last close; or departed since then, leaving nobody to
            # train: without a round to close, the departures take effect now (after round tau - 1).
            if self.pending_arrivals or self.pending_departures:
                arrivals, departures = self.take_events()
                changes = fed.apply_between_rounds(arrivals=arrivals, departures=departures)
                if self.can_train():
                    log.info("round %d: %s joined; training goes on", tau,
                             ", ".join(changes["arrivals"] + changes["founded"]))
                    return True
            if self.cfg.run.on_empty is OnEmpty.STOP:
                self.ended_empty = True
                log.error("no device is left to train (every one departed) before round %d: ending the run "
                          "(run.on_empty = stop); --resume continues it once devices join", tau)
                return False
            if not warned:
                warned = True
                log.warning("no device is left to train (every one departed): round %d waits until a device "
                            "joins (run.on_empty = wait)", tau)
            cond.wait(timeout=0.5)
        return False

    def can_train(self) -> bool:
        """Some member of the objective trains and has not announced its departure (pending until a close)."""
        departed = {d for d, r in self.registry.devices.items() if r.departed}
        return any(d not in departed for d in self.federation.objective.active_members())

    # ---- state ---------------------------------------------------------------------------

    def active(self) -> list[str]:
        """Registered devices that have not departed."""
        return [d for d, r in self.registry.devices.items() if not r.departed]

    def reported_memory(self, device_id: str, resident_bytes: int) -> None:
        """Keep the resident memory a device reported with an update (0: its agent does not report it)."""
        if resident_bytes > 0:
            self.known(device_id).resident_bytes = int(resident_bytes)

    def states(self, *, now: float) -> tuple[DeviceState, ...]:
        """Every registered device as the registry knows it; `now` (unix time) dates its last call."""
        members = set(self.federation.objective.sample_counts)
        return tuple(DeviceState(device_id=d.device_id, shard_index=d.shard_index, departed=d.departed,
                                 in_objective=d.device_id in members, joined_after_round=d.joined_after_round,
                                 connected=d.device_id in self.seen, resident_bytes=d.resident_bytes or None,
                                 seen_ago_s=max(0.0, now - d.last_seen) if d.device_id in self.seen else None)
                     for d in self.registry.devices.values())

    def restore(self, registry: Registry, journaled: Mapping[str, str]) -> None:
        """After the federation's restore: the checkpoint's registry, then each device's last journaled
        event (`journaled`, coordinator.resume.journaled_events) that the checkpoint does not hold.

        A departure announced after the checkpoint's close (or held pending when a stop saved
        it) leaves a member in the objective: it departs at the next close. A device that came
        back after its departure was checkpointed is back (its agent is running and will not
        join again). Replaying is idempotent: what the checkpoint holds is left alone.
        """
        self.registry = registry
        objective = self.federation.objective
        for device_id, event in journaled.items():
            record = registry.get(device_id)
            if record is None:
                continue
            if event == "leave" and device_id in objective.active_members():
                record.departed = True
                self.pending_departures.append(device_id)
                log.info("device %s announced its departure after the checkpoint: it takes effect at the next close",
                         device_id)
            elif event == "rejoin" and record.departed:
                record.departed = False
                log.info("device %s came back after the checkpoint", device_id)
        # Devices that joined (or came back) after the checkpoint's last close are in the registry
        # but not (or no longer) training in the objective: they still arrive.
        self.pending_arrivals = [d for d, rec in registry.devices.items()
                                 if not rec.departed and (d not in objective.sample_counts
                                                          or d in objective.departed_included)]
