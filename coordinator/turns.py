"""Turns to use a bounded resource of the servicer (sending a round's model, reading an update).

A transfer takes a turn of an asyncio.Semaphore and hands it back when it ends or after a few
seconds, whichever comes first: the transfer itself goes on, so a stalled device keeps its
stream but cannot hold the others up (coordinator/offering.py, coordinator/uploading.py).
"""

from __future__ import annotations

import asyncio


class Turn:
    """One of the semaphore's turns (to be sent a model, to have an update read), handed back when the
    transfer ends or after `hold_s`, whichever comes first (the transfer itself goes on)."""

    def __init__(self, turns: asyncio.Semaphore, *, hold_s: float) -> None:
        self.turns = turns
        self.hold_s = hold_s
        self._held = False
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> Turn:
        await self.turns.acquire()
        self._held = True
        self._timer = asyncio.get_running_loop().call_later(self.hold_s, self.release)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            self._held = False
            self.turns.release()
