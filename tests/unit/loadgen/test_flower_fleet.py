"""loadgen.flower_fleet's command lines: the node config as Flower reads it, and where a node runs (cgroup, netns,
prefix) in front of Flower's command. The processes themselves: tests/integration/test_flower_deployment.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loadgen.flower_fleet import NodeSpec, NodeValue, launch_argv, node_config_arg


def test_the_node_config_is_key_value_pairs_whose_values_read_back_as_toml() -> None:
    config: dict[str, NodeValue] = {"partition-id": 3, "num-partitions": 5, "step-delay-s": 0.05, "slow": True,
                                    "name": "pi 4"}
    arg = node_config_arg(config)
    assert arg == 'partition-id=3 num-partitions=5 step-delay-s=0.05 slow=true name="pi 4"'
    flower = pytest.importorskip("flwr.common.config", reason="Flower is FlexFL's [flower] extra")
    assert flower.parse_config_args([arg]) == config  # what flower-supernode --node-config makes of it


@pytest.mark.parametrize("config, message", [
    ({"partition id": 1}, "letters, digits and _.- only"),
    ({"name": 'say "hi"'}, "a string without quotes"),
    ({"ids": [1, 2]}, "not an int, float, bool"),
])
def test_what_flower_would_split_or_misread_is_refused_naming_the_key(config, message) -> None:
    with pytest.raises(ValueError, match=message):
        node_config_arg(config)


def test_a_node_runs_through_device_exec_in_its_cgroup_and_netns_behind_its_prefix() -> None:
    spec = NodeSpec(cgroup=Path("/sys/fs/cgroup/cpu/x/dev0"), netns="x-dev0", prefix=("nice", "-n", "5"))
    assert launch_argv(["flower-supernode", "--insecure"], spec=spec, die_with=42) == [
        sys.executable, "-m", "loadgen.device_exec", "--cgroup", "/sys/fs/cgroup/cpu/x/dev0", "--netns", "x-dev0",
        "--die-with", "42", "--", "nice", "-n", "5", "flower-supernode", "--insecure"]
    assert launch_argv(["flower-superlink"], die_with=7) == [
        sys.executable, "-m", "loadgen.device_exec", "--die-with", "7", "--", "flower-superlink"]
