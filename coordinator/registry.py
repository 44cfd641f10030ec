"""The device registry: who has joined, with what data and hardware, and in which state."""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field

from flexfl.errors import ConfigError, DeviceConflict


@dataclass
class DeviceRecord:
    device_id: str
    index: int  # stable, in join order (seeds a device's streams when it has no shard)
    sample_count: int
    hardware: dict = field(default_factory=dict)
    agent_version: str = ""
    joined_after_round: int = 0  # rounds completed when it (last) joined
    departed: bool = False
    last_seen: float = 0.0  # unix time
    shard_index: int | None = None  # shard of the seeded partition, when the device says
    resident_bytes: int = 0  # the agent's resident memory as it last reported it (join or update; 0: never)


class Registry:
    """Known devices by id. Not thread-safe by itself: the round engine holds its lock."""

    def __init__(self) -> None:
        self.devices: dict[str, DeviceRecord] = {}

    def __contains__(self, device_id: str) -> bool:
        return device_id in self.devices

    def get(self, device_id: str) -> DeviceRecord | None:
        return self.devices.get(device_id)

    def record(self, device_id: str) -> DeviceRecord:
        """The record of a device that has joined (KeyError otherwise: a caller's bug, not bad input)."""
        return self.devices[device_id]

    def check_claim(self, device_id: str, shard_index: int | None, sample_count: int | None = None) -> None:
        """Refuse a join whose data clashes with the registry: one shard (or one set of data of its own)
        per device id, and one device per shard.

        A registered id joining with another shard, or with another sample count of data of its own
        while it has not departed, is a second agent under that id (DeviceConflict): taken for a
        reconnection, it would train other data under the first one's weights. The registered device
        keeps its slot; a departed one may come back with other data of its own (its count is then
        the new one), and its shard may go to a new device.
        """
        record = self.devices.get(device_id)
        if record is not None and record.shard_index != shard_index:
            raise DeviceConflict(f"device {device_id!r} holds {_shard(record.shard_index)}; this join under the "
                                 f"same id claims {_shard(shard_index)}. Two agents with one device id? Each needs "
                                 f"its own (the registered device keeps its slot)")
        if (record is not None and shard_index is None and sample_count is not None and not record.departed
                and record.sample_count != sample_count):
            raise DeviceConflict(f"device {device_id!r} joined with {record.sample_count} samples of its own; this "
                                 f"join under the same id reports {sample_count}. Two agents with one device id? "
                                 f"Each needs its own (the registered device keeps its slot)")
        if shard_index is not None:
            holder = next((r.device_id for r in self.devices.values()
                           if r.shard_index == shard_index and r.device_id != device_id and not r.departed), None)
            if holder is not None:
                raise ConfigError(f"device {device_id!r}: shard {shard_index} is held by {holder!r}; "
                                  "every device needs its own shard_index")

    def add(self, device_id: str, *, sample_count: int, hardware: dict, agent_version: str, after_round: int,
            shard_index: int | None = None) -> DeviceRecord:
        if not device_id or len(device_id) > 128 or not device_id.isprintable():
            raise ConfigError(f"device id {device_id!r} must be 1-128 printable characters")
        record = DeviceRecord(
            device_id=device_id, index=len(self.devices), sample_count=sample_count, hardware=hardware,
            agent_version=agent_version, joined_after_round=after_round, last_seen=time.time(),
            shard_index=shard_index,
        )
        self.devices[device_id] = record
        return record

    def ordered(self, device_ids: list[str] | None = None) -> list[str]:
        """Device ids (all, or the given ones) in registry-index order."""
        ids = self.devices if device_ids is None else device_ids
        return sorted(ids, key=lambda d: self.devices[d].index)

    def snapshot(self) -> Registry:
        """A copy whose records do not change with this one's (cheap: records are flat)."""
        reg = Registry()
        reg.devices = {d: copy.copy(r) for d, r in self.devices.items()}
        return reg

    def to_dict(self) -> dict:
        return {d: asdict(r) for d, r in self.devices.items()}

    @classmethod
    def from_dict(cls, d: dict) -> Registry:
        reg = cls()
        try:
            for device_id, rec in d.items():
                reg.devices[str(device_id)] = DeviceRecord(**rec)
        except TypeError as exc:
            raise ConfigError(f"registry state is malformed: {exc}") from None
        return reg


def _shard(shard_index: int | None) -> str:
    return "no shard (data of its own)" if shard_index is None else f"shard {shard_index}"
