"""coordinator.runtime: a known gRPC aio shutdown race is not printed as a traceback; other errors are."""

from __future__ import annotations

import asyncio
import logging

from coordinator.runtime import _drop_grpc_poller_shutdown_error


def _raise_ebadf() -> None:
    raise OSError(9, "Bad file descriptor")


# The frame gRPC's Cython poller reports (SIGTERM on an idle coordinator printed it in 3 of 5 tries).
_raise_ebadf_in_poller = type(_raise_ebadf)(
    _raise_ebadf.__code__.replace(co_name="grpc._cython.cygrpc.PollerCompletionQueue._handle_events"),
    globals())


def _run_callbacks(*callbacks) -> None:
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_drop_grpc_poller_shutdown_error)
    try:
        for cb in callbacks:
            loop.call_soon(cb)
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()


def test_the_poller_shutdown_error_is_dropped_and_any_other_error_still_logged(caplog):
    with caplog.at_level(logging.DEBUG):
        _run_callbacks(_raise_ebadf_in_poller)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "grpc/grpc#34139" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        _run_callbacks(_raise_ebadf)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and "Exception in callback" in errors[0].getMessage()
