"""Checkpoint files: what the coordinator writes, and the readers other packages use."""

from __future__ import annotations

import pytest
import torch

from coordinator.checkpoint import Checkpoint, read_registry, save_checkpoint
from coordinator.registry import Registry
from flexfl.errors import FlexFLError


def test_the_registry_is_read_back_from_a_checkpoint_without_its_model(tmp_path) -> None:
    registry = Registry()
    registry.add("pi-1", sample_count=60, hardware={"cpu_model": "Cortex-A72", "cpu_count": 4},
                 agent_version="0.1.0", after_round=0, shard_index=0)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, Checkpoint(params={"w": torch.zeros(2)}, completed_round=3, run_id="r",
                                     registry=registry.to_dict(), objective={}))
    back = read_registry(path)
    assert list(back.devices) == ["pi-1"]
    assert back.get("pi-1").hardware == {"cpu_model": "Cortex-A72", "cpu_count": 4}
    assert back.get("pi-1").agent_version == "0.1.0"


@pytest.mark.parametrize("content", [None, b"not a checkpoint"], ids=["missing", "corrupt"])
def test_an_unreadable_checkpoint_is_a_flexfl_error_naming_the_file(tmp_path, content) -> None:
    path = tmp_path / "checkpoint.pt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(FlexFLError, match=r"checkpoint .*checkpoint.pt"):
        read_registry(path)
