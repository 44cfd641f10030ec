"""Plug-in strategies live: one with its own memory equals its simulation; a broken one stops the coordinator."""

from __future__ import annotations

import re

import pytest
import torch

from coordinator.metrics import read_metrics
from coordinator.rules.config import RulesConfig
from flexfl.errors import PluginError
from flexfl.run_spec import RunSpec
from simulator.engine import FixedParticipation, SimConfig, run_simulation
from workloads.partition_spec import PartitionSpec

from .conftest import coordinator_toml, flexfl_process, free_port
from .test_live_rounds import FORCED, _live_and_simulated

# A strategy with a per-device memory of its own (not MIFA's): Scheme B's weights for this round's updates,
# plus, for each member that sent nothing this round, its last update at p_k / 2^(rounds since it was sent).
STALE = """
    import numpy as np
    from coordinator.rules.memory import StrategyMemory
    from coordinator.rules.strategies import Strategy

    class Stale(StrategyMemory):
        def __init__(self):
            self.last, self.age = {}, {}

        def close(self, round):
            for device, update in round.updates.items():
                self.last[device] = {name: t.clone() for name, t in update.items()}
                self.age[device] = 0
            out = {name: w.clone() for name, w in round.aggregated.items()}
            for device in self.last:
                if device not in round.updates and device in round.devices:
                    self.age[device] += 1
                    weight = round.p[round.devices.index(device)] / 2 ** self.age[device]
                    out = {name: w + float(weight) * self.last[device][name] for name, w in out.items()}
            return out

        def keep_only(self, devices):
            self.last = {d: m for d, m in self.last.items() if d in devices}
            self.age = {d: a for d, a in self.age.items() if d in devices}

        @property
        def remembered(self):
            return sorted(self.last)

        def snapshot(self):
            return {"last": dict(self.last), "age": dict(self.age)}

        def restore(self, state):
            self.last, self.age = dict(state["last"]), dict(state["age"])

    class StaleAverage(Strategy):
        label = "stale"

        def arrival_weights(self, *, s, E, p):
            return np.where(s > 0, p, 0.0)

        def round_scale(self, *, s, E, p):
            return 1.0

        def new_memory(self, *, like):
            return Stale()
"""


def test_a_plug_in_strategy_with_its_own_memory_runs_live_as_in_simulation(live_config, fleet_factory,
                                                                           plugin_module):
    """The coordinator sums the updates as they arrive, the simulator stacks them: the plug-in's memory gets the
    same rounds from both (FORCED: dev-2 sends nothing in round 1, dev-3 in round 2) and makes the same model."""
    name = plugin_module(STALE)
    cfg, fleet, sim = _live_and_simulated(live_config, fleet_factory, strategy=f"{name}:StaleAverage")
    rows = read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")
    assert [[r.s[f"dev-{i}"] for i in range(4)] for r in rows] == FORCED
    # Its memory, not Federation's: who it remembered after each round, the same on both sides
    assert [r.remembered for r in rows] == [r.remembered for r in sim.records] == \
        [("dev-0", "dev-1", "dev-3"), ("dev-0", "dev-1", "dev-2", "dev-3"), ("dev-0", "dev-1", "dev-2", "dev-3")]
    live = fleet.coordinator.engine.params
    for tensor_name, value in sim.final_params.items():
        # Agents train per device, the simulator all devices at once: float32 rounding apart.
        torch.testing.assert_close(live[tensor_name], value, rtol=1e-3, atol=1e-4)
    # The memory changed the model: Scheme B, its weights without the stale updates, ends elsewhere.
    plain = run_simulation(SimConfig(partition=cfg.partition, rules=cfg.rules.with_strategy("B"),
                                     run=RunSpec(rounds=3, seed=cfg.run.seed)),
                           participation=FixedParticipation(FORCED, E=5))
    assert not all(torch.allclose(live[n], v, rtol=1e-3, atol=1e-4) for n, v in plain.final_params.items())


NAN_ON_REAL_ROUNDS = """
    import numpy as np
    from coordinator.rules.strategies import Strategy

    class NanOnRealRounds(Strategy):
        label = "nan-real"

        def arrival_weights(self, *, s, E, p):
            if E == 4:  # the start-up probe's round: passes
                return np.where(s > 0, p, 0.0)
            return np.full(len(s), np.nan)

        def round_scale(self, *, s, E, p):
            return 1.0
"""


def test_a_plug_in_strategy_that_fails_on_a_real_round_stops_the_coordinator(tmp_path, plugin_module, agents, procs,
                                                                              monkeypatch):
    """Before, every valid push was refused (INVALID_ARGUMENT "... for device 0", an index into a one-element
    array), rows showed s = 0 and the coordinator exited 0; the simulator stops the same plug-in with exit 2."""
    name = plugin_module(NAN_ON_REAL_ROUNDS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "plugins"))  # the coordinator process imports it too
    port = free_port()
    config = coordinator_toml(tmp_path, port, rounds=3, deadline_s=300.0, strategy=f"{name}:NanOnRealRounds")
    log = tmp_path / "coordinator.log"
    coord = flexfl_process("coordinator", "--config", str(config), log=log)
    procs.append(coord)
    for i in range(3):
        agents(port, i)
    # 300 s deadlines: a coordinator that only failed the pushes would still be waiting for round 1's
    assert coord.wait(timeout=120) == 2, log.read_text()[-3000:]
    errors = [line for line in log.read_text().splitlines() if line.startswith("flexfl: error: ")]
    assert len(errors) == 1, log.read_text()[-3000:]
    assert re.fullmatch(rf"flexfl: error: strategy plug-in '{name}:NanOnRealRounds' returned arrival weight nan "
                        r"for device 'dev-[0-2]' \(s = [1-5], p = 0\.\d+\); a weight must be a finite number >= 0",
                        errors[0]), errors[0]
    metrics = tmp_path / "out" / "metrics.jsonl"
    assert not metrics.exists() or read_metrics(metrics) == []  # no round ran without training


def test_the_simulator_stops_the_same_plug_in_naming_the_device(plugin_module):
    name = plugin_module(NAN_ON_REAL_ROUNDS)
    cfg = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=3, total_samples=600),
                    rules=RulesConfig(strategy=f"{name}:NanOnRealRounds", required_updates=5), run=RunSpec(rounds=1))
    with pytest.raises(PluginError, match=r"returned arrival weight nan for device 'dev-0' \(s = 5"):
        run_simulation(cfg, participation=FixedParticipation([[5, 5, 5]], E=5))
