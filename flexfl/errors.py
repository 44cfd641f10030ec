"""The project's exception hierarchy: one base class, narrow subclasses per concern."""


# How `flexfl` prints a FlexFLError: one line on stderr (flexfl.app.cli); the harness finds it in logs.
ERROR_PREFIX = "flexfl: error: "

class FlexFLError(Exception):
    """Base class of every error FlexFL raises on purpose."""


class ConfigError(FlexFLError):
    """A configuration value or command-line flag is invalid."""


class DataError(FlexFLError):
    """A dataset is missing, malformed or cannot be partitioned as asked."""


class DatasetNotFoundError(DataError):
    """A dataset that cannot be downloaded at run time is not where it should be."""


class TraceFormatError(FlexFLError):
    """A trace set (manifest or trace CSV) is malformed; the message names file, line and field."""


class AggregationError(FlexFLError):
    """Aggregation inputs are inconsistent (shapes, lengths, non-finite values)."""


class UpdateRejected(FlexFLError):
    """A device's update failed validation and was not applied."""


class LogRejected(FlexFLError):
    """A device's log lines (SendLog) are malformed, or its id cannot name its log file; none of them was kept."""


class PluginError(ConfigError):
    """A plug-in (a model, dataset or strategy named by import path or entry point) cannot be imported, lacks what
    FlexFL needs, gives what it must not (a wrong shape or dtype), or raised in its own code; one line naming it."""


class PartitionMismatch(ConfigError):
    """A device's data partition or dataset differs from the coordinator's."""


class UnknownDevice(FlexFLError):
    """A call names a device that never joined this coordinator."""


class IdentityMismatch(FlexFLError):
    """A call claims to be another device than the one that makes it."""


class Unauthenticated(FlexFLError):
    """A call without the fleet token, or with a wrong one."""


class MissingDevice(Unauthenticated):
    """A call without the x-flexfl-device metadata: it does not say which device makes it."""


class DeviceConflict(FlexFLError):
    """A join claims a registered device id with other data (another shard): a second agent under that id."""


class DeviceBusy(FlexFLError):
    """A device that already has a live Session or PullRound call opened another; it may hold one at a time."""


class ProtocolMismatch(FlexFLError):
    """A device speaks another version of the wire protocol."""


class RoundStateError(FlexFLError):
    """The round's state does not allow this now: a round opened out of turn, updates or membership
    events for a round or device they do not belong to, a member added twice. A state, not a bad
    value: gRPC refuses it with FAILED_PRECONDITION (coordinator/status.py)."""


class WrongRoundState(UpdateRejected, RoundStateError):
    """An update for a round that is not open, from a device not in it, a duplicate, or too late."""


class ReportError(FlexFLError):
    """A folder given to `flexfl report` is not a run, sweep or trace set, or its files are malformed."""


class DivergenceError(FlexFLError):
    """Training diverged: the loss became NaN or infinite (a learning rate too high for the setup); the
    message names the round and the run's setup."""


class SweepError(FlexFLError):
    """Some runs of a sweep failed; the others' results are saved and a rerun resumes."""


class ClusterError(FlexFLError):
    """A Ray cluster cannot be reached at the address given, or refuses this driver (token authentication)."""
