"""Each device's part in the last closed round that counted it, and its link: what Status shows per device.

The finisher makes every closed round's record (coordinator.rules.round_record.RoundRecord) and
notes it here as it is made; Status reads each device's newest entry. Small entries rather than
references to the rows: a device last counted long ago would otherwise keep its whole row (every
device's s, p, coefficients...) alive, and a fleet that comes and goes would keep many.

The link is the device's own measure. Its update carries the time it measured for its previous
upload (UpdateReport.previous_upload_s); when that previous upload is the update of the round that
last counted it, taken with a delta in it (s > 0), the time is that upload's, measured
(edge_agent.deadline.Estimates), and the rate is that update's bytes over it. Otherwise (its last
round sent no delta, was missed or refused) the device's estimate may have decayed or been raised
without a measurement, and the rate it had stays.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from coordinator.rules.round_record import RoundRecord
from flexfl.exchange import DeviceRound
from flexfl.vocabulary import StopReason


@dataclass(frozen=True)
class _Entry:
    last: DeviceRound
    delta_bytes: int  # its update's bytes when one with a delta was taken in that round, else 0
    upload_bytes_per_s: float | None


class DeviceRounds:
    """The newest closed round of each device (noted by the finisher's evaluator thread, read by Status)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def note(self, row: RoundRecord) -> None:
        """Take a live round's record: every device in its s (a simulated row, without `live`, is ignored)."""
        live = row.live
        if live is None:
            return
        reasons = row.stop_reason or {}
        with self._lock:
            for d, s in row.s.items():
                before = self._entries.get(d)
                rate = before.upload_bytes_per_s if before is not None else None
                taken = d in live.bytes_in
                upload_s = live.previous_upload_s.get(d, 0.0)
                if taken and before is not None and before.delta_bytes and upload_s > 0:
                    rate = before.delta_bytes / upload_s
                last = DeviceRound(round_id=row.round, s=s, stop_reason=reasons.get(d, str(StopReason.UNKNOWN)),
                                   bytes_in=live.bytes_in.get(d, 0), bytes_out=live.bytes_out.get(d, 0),
                                   train_s=live.train_s.get(d, 0.0))
                self._entries[d] = _Entry(last=last, delta_bytes=live.bytes_in[d] if taken and s > 0 else 0,
                                          upload_bytes_per_s=rate)

    def last_round(self, device_id: str) -> DeviceRound | None:
        """The device's part in the newest closed round that counted it (None: none since this process started)."""
        with self._lock:
            entry = self._entries.get(device_id)
        return entry.last if entry is not None else None

    def upload_bytes_per_s(self, device_id: str) -> float | None:
        """The device's upload rate, as it measured it (None: not measured yet)."""
        with self._lock:
            entry = self._entries.get(device_id)
        return entry.upload_bytes_per_s if entry is not None else None
