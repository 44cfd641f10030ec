"""Domain errors to gRPC status codes, in one table: what a refused call tells the device.

Each entry gives the status code and the machine-readable reason, which travels as trailing
metadata (proto/options.py) so that agents act on code and reason, never on message text.
A class takes the entry of its most specific ancestor that has one: bad input is
INVALID_ARGUMENT, a request the round's state does not allow FAILED_PRECONDITION, an unknown
or unauthenticated device UNAUTHENTICATED (proto/fleet.proto lists them per call).
"""

from __future__ import annotations

import functools
import inspect
from contextlib import aclosing

import grpc
from flexfl.proto.options import ERROR_HEADER, ErrorReason

from flexfl.errors import (
    ConfigError,
    DeviceBusy,
    DeviceConflict,
    IdentityMismatch,
    LogRejected,
    MissingDevice,
    PartitionMismatch,
    ProtocolMismatch,
    RoundStateError,
    Unauthenticated,
    UnknownDevice,
    UpdateRejected,
    WrongRoundState,
)

Code = grpc.StatusCode
ERRORS: dict[type[Exception], tuple[grpc.StatusCode, ErrorReason]] = {
    MissingDevice: (Code.UNAUTHENTICATED, ErrorReason.MISSING_DEVICE),
    Unauthenticated: (Code.UNAUTHENTICATED, ErrorReason.BAD_TOKEN),
    UnknownDevice: (Code.UNAUTHENTICATED, ErrorReason.UNKNOWN_DEVICE),
    IdentityMismatch: (Code.PERMISSION_DENIED, ErrorReason.IDENTITY_MISMATCH),
    DeviceConflict: (Code.ALREADY_EXISTS, ErrorReason.DEVICE_CONFLICT),
    # A per-device quota (one live stream): agents retry it with backoff, as a reconnecting one must.
    DeviceBusy: (Code.RESOURCE_EXHAUSTED, ErrorReason.DEVICE_BUSY),
    ProtocolMismatch: (Code.FAILED_PRECONDITION, ErrorReason.PROTOCOL_VERSION),
    PartitionMismatch: (Code.FAILED_PRECONDITION, ErrorReason.PARTITION_MISMATCH),
    WrongRoundState: (Code.FAILED_PRECONDITION, ErrorReason.WRONG_ROUND_STATE),
    UpdateRejected: (Code.INVALID_ARGUMENT, ErrorReason.UPDATE_REJECTED),
    RoundStateError: (Code.FAILED_PRECONDITION, ErrorReason.WRONG_ROUND_STATE),
    ConfigError: (Code.INVALID_ARGUMENT, ErrorReason.INVALID_ARGUMENT),
    LogRejected: (Code.INVALID_ARGUMENT, ErrorReason.INVALID_ARGUMENT),
}


def status_of(exc: Exception) -> tuple[grpc.StatusCode, ErrorReason] | None:
    """The table's entry for `exc`'s most specific class that has one (None: not a domain error)."""
    return next((ERRORS[cls] for cls in type(exc).__mro__ if cls in ERRORS), None)


def refuse(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    """Set the call's status from the table: code, reason (trailing metadata) and the error's text."""
    entry = status_of(exc)
    if entry is None:
        raise TypeError(f"refuse() takes an error of the ERRORS table, got {type(exc).__name__}") from exc
    code, reason = entry
    context.set_code(code)
    context.set_details(str(exc))
    context.set_trailing_metadata(((ERROR_HEADER, str(reason)),))


def mapped(handler):
    """Wrap a handler (coroutine or async generator): a domain error ends the call with its status.

    The call ends by returning with the status set, never by context.abort(). abort() raises an
    AbortError that grpc.aio keeps on the call's state; its traceback holds the handler's frames,
    they hold the context, the context the state: a reference cycle. Raised while the domain
    error was being handled, it also chains that error (__context__), whose traceback holds the
    frames that received the upload. Only a full garbage collection frees such a cycle, and with
    the start-up objects frozen (coordinator/runtime.py) those are rare: 100 refused 63 MiB
    uploads grew the coordinator from 243 to 7,218-7,526 MiB (benchmarks/refused_uploads.py). Returning
    leaves nothing behind: the error and the frames it holds go as this function's except ends.
    """
    if inspect.isasyncgenfunction(handler):
        @functools.wraps(handler)
        async def streaming(self, request, context: grpc.aio.ServicerContext):
            try:
                async with aclosing(handler(self, request, context)) as messages:
                    async for message in messages:
                        yield message
            except tuple(ERRORS) as exc:
                refuse(context, exc)
        return streaming

    @functools.wraps(handler)
    async def unary(self, request, context: grpc.aio.ServicerContext):
        try:
            return await handler(self, request, context)
        except tuple(ERRORS) as exc:
            refuse(context, exc)
            return None  # with a status other than OK, grpc.aio sends no message
    return unary
