"""Errors raised by the load generators; all derive from FlexFLError."""

from flexfl.errors import FlexFLError


class LoadgenError(FlexFLError):
    """Base class of load-generator errors."""


class CpuLoadError(LoadgenError):
    """stress-ng is missing, failed to start, or a CPU level is out of range."""


class ShapingError(LoadgenError):
    """A tc command failed: no such interface, no privilege, or a missing qdisc module."""


class CgroupError(LoadgenError):
    """A cgroup's CPU quota files hold what the kernel never writes (a period of 0, not a number)."""


class NetnsError(LoadgenError):
    """An `ip netns` / `ip link` command failed."""


class ProtocolError(LoadgenError):
    """A daemon request is malformed; the message names the field."""


class DaemonError(LoadgenError):
    """A daemon did not answer in time, or answered with an error."""
