from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    INT64: _ClassVar[DType]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_COMPLETE: _ClassVar[StopReason]
    STOP_REASON_COMPUTE: _ClassVar[StopReason]
    STOP_REASON_UPLOAD: _ClassVar[StopReason]
    STOP_REASON_TRACE: _ClassVar[StopReason]
    STOP_REASON_STOPPED: _ClassVar[StopReason]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT64: DType
INT64: DType
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_COMPLETE: StopReason
STOP_REASON_COMPUTE: StopReason
STOP_REASON_UPLOAD: StopReason
STOP_REASON_TRACE: StopReason
STOP_REASON_STOPPED: StopReason

class TensorSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., nbytes: _Optional[int] = ...) -> None: ...

class Payload(_message.Message):
    __slots__ = ("tensors", "total_bytes", "sha256", "crc32")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    sha256: bytes
    crc32: int
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[bytes] = ..., crc32: _Optional[int] = ...) -> None: ...

class HardwareFacts(_message.Message):
    __slots__ = ("cpu_model", "cpu_count", "memory_bytes", "os", "machine", "python", "hostname")
    CPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    cpu_model: str
    cpu_count: int
    memory_bytes: int
    os: str
    machine: str
    python: str
    hostname: str
    def __init__(self, cpu_model: _Optional[str] = ..., cpu_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., os: _Optional[str] = ..., machine: _Optional[str] = ..., python: _Optional[str] = ..., hostname: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("device_id", "sample_count", "hardware", "agent_version", "protocol_version", "shard_index", "partition_json", "resident_bytes")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    PARTITION_JSON_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    sample_count: int
    hardware: HardwareFacts
    agent_version: str
    protocol_version: int
    shard_index: int
    partition_json: str
    resident_bytes: int
    def __init__(self, device_id: _Optional[str] = ..., sample_count: _Optional[int] = ..., hardware: _Optional[_Union[HardwareFacts, _Mapping]] = ..., agent_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., shard_index: _Optional[int] = ..., partition_json: _Optional[str] = ..., resident_bytes: _Optional[int] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("device_id", "device_index", "arrival", "current_round", "run_id", "partition_json")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_JSON_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    device_index: int
    arrival: bool
    current_round: int
    run_id: str
    partition_json: str
    def __init__(self, device_id: _Optional[str] = ..., device_index: _Optional[int] = ..., arrival: _Optional[bool] = ..., current_round: _Optional[int] = ..., run_id: _Optional[str] = ..., partition_json: _Optional[str] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("device_id", "reason")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    reason: str
    def __init__(self, device_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: str
    def __init__(self, policy: _Optional[str] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("device_id", "after_round", "wait_s")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    after_round: int
    wait_s: float
    def __init__(self, device_id: _Optional[str] = ..., after_round: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class ModelDescription(_message.Message):
    __slots__ = ("architecture", "num_classes", "in_features")
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    IN_FEATURES_FIELD_NUMBER: _ClassVar[int]
    architecture: str
    num_classes: int
    in_features: int
    def __init__(self, architecture: _Optional[str] = ..., num_classes: _Optional[int] = ..., in_features: _Optional[int] = ...) -> None: ...

class RoundHeader(_message.Message):
    __slots__ = ("status", "round_id", "required_updates", "learning_rate", "batch_size", "deadline_s", "model", "payload", "seed", "unit", "device_index", "trace_sampling", "s_rule", "proximal_mu")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[RoundHeader.Status]
        ROUND: _ClassVar[RoundHeader.Status]
        WAIT: _ClassVar[RoundHeader.Status]
        FINISHED: _ClassVar[RoundHeader.Status]
    STATUS_UNSPECIFIED: RoundHeader.Status
    ROUND: RoundHeader.Status
    WAIT: RoundHeader.Status
    FINISHED: RoundHeader.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_UPDATES_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TRACE_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    S_RULE_FIELD_NUMBER: _ClassVar[int]
    PROXIMAL_MU_FIELD_NUMBER: _ClassVar[int]
    status: RoundHeader.Status
    round_id: int
    required_updates: int
    learning_rate: float
    batch_size: int
    deadline_s: float
    model: ModelDescription
    payload: Payload
    seed: int
    unit: str
    device_index: int
    trace_sampling: str
    s_rule: str
    proximal_mu: float
    def __init__(self, status: _Optional[_Union[RoundHeader.Status, str]] = ..., round_id: _Optional[int] = ..., required_updates: _Optional[int] = ..., learning_rate: _Optional[float] = ..., batch_size: _Optional[int] = ..., deadline_s: _Optional[float] = ..., model: _Optional[_Union[ModelDescription, _Mapping]] = ..., payload: _Optional[_Union[Payload, _Mapping]] = ..., seed: _Optional[int] = ..., unit: _Optional[str] = ..., device_index: _Optional[int] = ..., trace_sampling: _Optional[str] = ..., s_rule: _Optional[str] = ..., proximal_mu: _Optional[float] = ...) -> None: ...

class RoundChunk(_message.Message):
    __slots__ = ("header", "data", "reply")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    data: bytes
    reply: PushReply
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., reply: _Optional[_Union[PushReply, _Mapping]] = ...) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("device_id", "round_id", "updates_completed", "samples_used", "train_s", "previous_upload_s", "local_loss", "payload", "stop_reason", "resident_bytes")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATES_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_USED_FIELD_NUMBER: _ClassVar[int]
    TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_UPLOAD_S_FIELD_NUMBER: _ClassVar[int]
    LOCAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    round_id: int
    updates_completed: int
    samples_used: int
    train_s: float
    previous_upload_s: float
    local_loss: float
    payload: Payload
    stop_reason: StopReason
    resident_bytes: int
    def __init__(self, device_id: _Optional[str] = ..., round_id: _Optional[int] = ..., updates_completed: _Optional[int] = ..., samples_used: _Optional[int] = ..., train_s: _Optional[float] = ..., previous_upload_s: _Optional[float] = ..., local_loss: _Optional[float] = ..., payload: _Optional[_Union[Payload, _Mapping]] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., resident_bytes: _Optional[int] = ...) -> None: ...

class UpdateChunk(_message.Message):
    __slots__ = ("header", "data", "pull")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    header: UpdateHeader
    data: bytes
    pull: PullRequest
    def __init__(self, header: _Optional[_Union[UpdateHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., pull: _Optional[_Union[PullRequest, _Mapping]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("round_id", "accepted", "message")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    accepted: bool
    message: str
    def __init__(self, round_id: _Optional[int] = ..., accepted: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceRound(_message.Message):
    __slots__ = ("round_id", "updates_completed", "stop_reason", "bytes_in", "bytes_out", "train_s")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATES_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    updates_completed: int
    stop_reason: str
    bytes_in: int
    bytes_out: int
    train_s: float
    def __init__(self, round_id: _Optional[int] = ..., updates_completed: _Optional[int] = ..., stop_reason: _Optional[str] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., train_s: _Optional[float] = ...) -> None: ...

class DeviceStatus(_message.Message):
    __slots__ = ("device_id", "shard_index", "departed", "in_objective", "joined_after_round", "connected", "streaming", "round_state", "last_round", "resident_bytes", "upload_bytes_per_s", "seen_ago_s")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_FIELD_NUMBER: _ClassVar[int]
    IN_OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    JOINED_AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    ROUND_STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    SEEN_AGO_S_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    shard_index: int
    departed: bool
    in_objective: bool
    joined_after_round: int
    connected: bool
    streaming: bool
    round_state: str
    last_round: DeviceRound
    resident_bytes: int
    upload_bytes_per_s: float
    seen_ago_s: float
    def __init__(self, device_id: _Optional[str] = ..., shard_index: _Optional[int] = ..., departed: _Optional[bool] = ..., in_objective: _Optional[bool] = ..., joined_after_round: _Optional[int] = ..., connected: _Optional[bool] = ..., streaming: _Optional[bool] = ..., round_state: _Optional[str] = ..., last_round: _Optional[_Union[DeviceRound, _Mapping]] = ..., resident_bytes: _Optional[int] = ..., upload_bytes_per_s: _Optional[float] = ..., seen_ago_s: _Optional[float] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("run_id", "completed_round", "open_round", "started", "finished", "rounds", "devices", "partition_json", "required_updates", "deadline_s", "round_open_s", "round_closes_in_s")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_ROUND_FIELD_NUMBER: _ClassVar[int]
    OPEN_ROUND_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PARTITION_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_UPDATES_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    ROUND_OPEN_S_FIELD_NUMBER: _ClassVar[int]
    ROUND_CLOSES_IN_S_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    completed_round: int
    open_round: int
    started: bool
    finished: bool
    rounds: int
    devices: _containers.RepeatedCompositeFieldContainer[DeviceStatus]
    partition_json: str
    required_updates: int
    deadline_s: float
    round_open_s: float
    round_closes_in_s: float
    def __init__(self, run_id: _Optional[str] = ..., completed_round: _Optional[int] = ..., open_round: _Optional[int] = ..., started: _Optional[bool] = ..., finished: _Optional[bool] = ..., rounds: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[DeviceStatus, _Mapping]]] = ..., partition_json: _Optional[str] = ..., required_updates: _Optional[int] = ..., deadline_s: _Optional[float] = ..., round_open_s: _Optional[float] = ..., round_closes_in_s: _Optional[float] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("time_s", "level", "logger", "message")
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    LOGGER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    time_s: float
    level: str
    logger: str
    message: str
    def __init__(self, time_s: _Optional[float] = ..., level: _Optional[str] = ..., logger: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class LogBatch(_message.Message):
    __slots__ = ("lines", "dropped")
    LINES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    dropped: int
    def __init__(self, lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., dropped: _Optional[int] = ...) -> None: ...

class LogReply(_message.Message):
    __slots__ = ("kept", "dropped")
    KEPT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    kept: int
    dropped: int
    def __init__(self, kept: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...
