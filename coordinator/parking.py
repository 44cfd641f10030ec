"""Pulls parked until their device has a round: one callback each, called once when it may have one.

A device asking for its next round while none is open for it parks a callback (the gRPC
servicer's coroutine waits on it: no thread is held), called when a round opens for that
device or training ends, never on a push; a thousand long polls cost little and a round's
opening wakes only its participants. Not thread-safe by itself: the round engine holds its
lock, under which callbacks are called (they must only signal, e.g. set an event).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class ParkedPulls:
    def __init__(self) -> None:
        self._by_device: dict[str, list[Callable[[], None]]] = {}
        self.woken = 0  # callbacks called so far

    def park(self, device_id: str, wake: Callable[[], None]) -> None:
        self._by_device.setdefault(device_id, []).append(wake)

    def unpark(self, device_id: str, wake: Callable[[], None]) -> None:
        """Withdraw `wake` (nothing happens if it was already called)."""
        parked = self._by_device.get(device_id)
        if parked and wake in parked:
            parked.remove(wake)

    def __len__(self) -> int:
        return sum(len(w) for w in self._by_device.values())

    def wake(self, devices: Iterable[str] | None = None) -> None:
        """Call and forget the callbacks of `devices` (None: every device's)."""
        for d in list(self._by_device) if devices is None else devices:
            for wake in self._by_device.pop(d, ()):
                wake()
                self.woken += 1
