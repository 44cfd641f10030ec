"""The round engine without a network: who a push wakes, and the round it closes with summed updates."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.engine import RoundEngine
from coordinator.metrics import read_metrics
from coordinator.rules.config import RulesConfig
from coordinator.rules.objective import Objective
from flexfl.exchange import DeviceRound, Join, OfferStatus, RoundOffer, UpdateReport
from flexfl.vocabulary import StopReason
from workloads.federated import build_federated
from workloads.partition_spec import PartitionSpec

E = 3


def _wait_for(predicate, what: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def engine(tmp_path):
    cfg = CoordinatorConfig(
        server=ServerConfig(fleet_token="t", pull_wait_s=60.0),  # parked pulls never time out in a test
        partition=PartitionSpec(dataset="synthetic", n_devices=4, total_samples=800),
        rules=RulesConfig(required_updates=E), run=RunConfig(rounds=2, deadline_s=60.0, min_devices=2),
        output=OutputConfig(dir=str(tmp_path / "out")))
    eng = RoundEngine(cfg, data=build_federated(cfg.partition))
    thread = threading.Thread(target=eng.run, daemon=True)
    yield eng, thread
    eng.stop()
    if thread.is_alive():
        thread.join(timeout=30)


def _join(eng: RoundEngine, device_id: str) -> None:
    eng.join(Join(device_id=device_id, sample_count=50))


def _pull(eng: RoundEngine, device_id: str, *, wait_s: float) -> RoundOffer:
    """Wait (blocking this thread) up to `wait_s` for the device's next round, as the servicer does."""
    limit = time.monotonic() + wait_s
    while True:
        woken = threading.Event()
        offer = eng.offer(device_id, wake=woken.set)
        if offer is not None:
            return offer
        woken.wait(max(0.0, limit - time.monotonic()))
        eng.unpark(device_id, woken.set)
        if not woken.is_set():
            return eng.waiting_reply()


def _answer(eng: RoundEngine, device_id: str, delta_value: float) -> None:
    offer = _pull(eng, device_id, wait_s=5)
    assert offer.status is OfferStatus.ROUND
    eng.delivered(device_id, offer.round_id, 1000)
    delta = {n: np.full(p.shape, delta_value, dtype=np.float32) for n, p in eng.params.items()}
    eng.push(device_id, UpdateReport(round_id=offer.round_id, updates_completed=E), delta, bytes_in=1000)


def test_a_push_wakes_no_parked_pull_and_an_opening_wakes_exactly_its_participants(engine):
    eng, thread = engine
    _join(eng, "a")
    _join(eng, "b")
    thread.start()
    _wait_for(lambda: eng.current is not None and eng.current.round_id == 1, "round 1 to open")
    # Ten devices join during round 1 (arrivals: they train from round 2) and park a PullRound each.
    late = [f"late-{i}" for i in range(10)]
    got: dict[str, RoundOffer] = {}
    for d in late:
        _join(eng, d)
    pullers = [threading.Thread(target=lambda d=d: got.__setitem__(d, _pull(eng, d, wait_s=60)))
               for d in late]
    for t in pullers:
        t.start()
    _wait_for(lambda: eng.parked() == len(late), "the late devices' pulls to park")
    before = eng.pull_wakeups

    _answer(eng, "a", 0.5)
    assert eng.pull_wakeups == before  # a push notified none of the ten parked pulls
    assert eng.current.round_id == 1 and not eng.current.closed  # the branch under test ran: b still owes
    _answer(eng, "b", 0.5)  # the last answer closes round 1; round 2 opens for all twelve
    for t in pullers:
        t.join(timeout=30)
    assert {d: h.status for d, h in got.items()} == {d: OfferStatus.ROUND for d in late}
    assert {h.round_id for h in got.values()} == {2}
    assert eng.pull_wakeups == before + len(late)  # the opening woke each parked pull once


def test_the_engine_closes_rounds_from_the_running_sum_and_writes_rows_before_checkpoints(engine):
    eng, thread = engine
    _join(eng, "a")
    _join(eng, "b")
    start = {n: p.clone() for n, p in eng.params.items()}
    thread.start()
    for tau in (1, 2):
        _wait_for(lambda tau=tau: eng.current is not None and eng.current.round_id == tau, f"round {tau} to open")
        _answer(eng, "a", 1.0)
        _answer(eng, "b", 3.0)
    thread.join(timeout=60)
    assert eng.finished
    # Two rounds, each w <- w + 0.5 * 1 + 0.5 * 3 (Scheme C, everyone complete, equal shares).
    for n, p in eng.params.items():
        torch.testing.assert_close(p, start[n] + 4.0)
    rows = read_metrics(eng.out_dir / "metrics.jsonl")
    assert [r.round for r in rows] == [1, 2]
    assert all(np.isfinite(r.test_acc) and r.live.close_reason == "all answered" for r in rows)
    saved = torch.load(eng.checkpoint_path, weights_only=True)
    assert saved["completed_round"] == 2
    # The Gamma state (sketches as tensors) survives a weights-only load: a resumed run keeps it.
    assert Objective.from_dict(saved["objective"]).gammas == eng.objective.gammas
    assert eng.objective.gamma("a") is not None  # two contributing rounds: one product each


def test_a_round_every_device_left_before_answering_does_not_count_and_the_run_waits(engine):
    """Before: round 2 closed with s = {} (model unchanged) as one of the run's two rounds."""
    eng, thread = engine
    _join(eng, "a")
    _join(eng, "b")
    thread.start()
    _wait_for(lambda: eng.current is not None and eng.current.round_id == 1, "round 1 to open")
    _answer(eng, "a", 1.0)
    _answer(eng, "b", 1.0)
    _wait_for(lambda: eng.current is not None and eng.current.round_id == 2, "round 2 to open")
    eng.leave("a", "stopped")
    eng.leave("b", "stopped")
    # The departures take effect without a round, and the run waits.
    _wait_for(lambda: not eng.objective.active_members(), "the departures to take effect")
    assert eng.completed_round == 1 and not eng.finished
    _join(eng, "c")  # an arrival: round 2 runs with it
    _wait_for(lambda: eng.current is not None and eng.current.round_id == 2 and "c" in eng.current.taking_part,
              "round 2 to open again for c")
    _answer(eng, "c", 1.0)
    thread.join(timeout=60)
    assert eng.finished
    rows = read_metrics(eng.out_dir / "metrics.jsonl")
    assert [r.round for r in rows] == [1, 2]
    assert rows[1].s == {"c": E}


def test_a_stage_that_fell_behind_takes_the_waiting_items_together_and_stops_after_a_failure():
    from coordinator.finisher import Stage as _Stage

    calls, release = [], threading.Event()

    def work(items):
        calls.append(list(items))
        if items == [1]:
            release.wait(30)  # the writer is slow: 2 and 3 queue up meanwhile
        if 4 in items:
            raise OSError("disk full")

    stage = _Stage("test-stage", work, depth=2)
    stage.put(1)
    _wait_for(lambda: calls == [[1]], "the first item to be taken")
    stage.put(2)
    stage.put(3)
    release.set()
    stage.drain()
    assert calls == [[1], [2, 3]]  # one catch-up call, in order (one fsync, the newest checkpoint)
    stage.put(4)
    stage.drain()
    stage.put(5)  # dropped: nothing is written after a failed write
    stage.drain()
    stage.close()
    assert calls == [[1], [2, 3], [4]] and isinstance(stage.error, OSError)


def _mifa_config(tmp_path, strategy: str = "mifa") -> CoordinatorConfig:
    return CoordinatorConfig(
        server=ServerConfig(fleet_token="t", pull_wait_s=60.0),
        partition=PartitionSpec(dataset="synthetic", n_devices=4, total_samples=800),
        rules=RulesConfig(required_updates=E, strategy=strategy), run=RunConfig(rounds=1,
                                                                                deadline_s=60.0, min_devices=2),
        output=OutputConfig(dir=str(tmp_path / "out")))


def test_mifas_memories_survive_a_coordinator_restart_and_a_checkpoint_without_them_is_refused(tmp_path):
    from flexfl.errors import ConfigError

    cfg = _mifa_config(tmp_path)
    eng = RoundEngine(cfg, data=build_federated(cfg.partition))
    thread = threading.Thread(target=eng.run, daemon=True)
    _join(eng, "a")
    _join(eng, "b")
    thread.start()
    try:
        _wait_for(lambda: eng.current is not None and eng.current.round_id == 1, "round 1 to open")
        _answer(eng, "a", 1.0)
        _answer(eng, "b", 3.0)
        thread.join(timeout=60)
        assert eng.finished
    finally:
        eng.stop()
    before = eng.federation.memory.snapshot()
    assert set(before["memories"]) == {"a", "b"}
    resumed = RoundEngine(cfg, data=build_federated(cfg.partition), resume=True)
    try:
        after = resumed.federation.memory
        assert after is not None and after.samples == before["samples"]
        for device, m in before["memories"].items():
            for name, value in m.items():  # m = (E / s) delta / lr with s = E, lr = eta_0 = 1: the delta
                torch.testing.assert_close(after.memories[device][name], value)
                torch.testing.assert_close(value, torch.full_like(value, 1.0 if device == "a" else 3.0))
    finally:
        resumed.stop()
        resumed.folder.release()
    other = _mifa_config(tmp_path / "c", strategy="scheme-c")
    (tmp_path / "c").mkdir()
    plain = RoundEngine(other, data=build_federated(other.partition))
    plain._save()  # a Scheme C checkpoint: no memories in it
    plain.stop()
    plain.folder.release()  # it never ran, which is what releases the folder
    with pytest.raises(ConfigError, match="holds no update memory, which strategy 'mifa' needs to resume"):
        RoundEngine(_mifa_config(tmp_path / "c"), data=build_federated(other.partition), resume=True)


KEEPS_LAST = """
    import numpy as np
    from coordinator.rules.memory import StrategyMemory
    from coordinator.rules.strategies import Strategy

    class KeepsLast(StrategyMemory):
        def __init__(self):
            self.last = {}

        def close(self, round):
            self.last.update({d: {n: t.clone() for n, t in u.items()} for d, u in round.updates.items()})
            return dict(round.aggregated) if round.round_index == 1 else {"w": 0}

        def snapshot(self):
            return {"last": self.last}

        def restore(self, state):
            self.last = state["last"]

    class KeepsLastB(Strategy):
        label = "keeps-last"

        def arrival_weights(self, *, s, E, p):
            return np.where(s > 0, p, 0.0)

        def round_scale(self, *, s, E, p):
            return 1.0

        def new_memory(self, *, like):
            return KeepsLast()
"""


def test_a_plug_in_strategys_memory_survives_a_coordinator_restart_and_a_bad_model_from_it_is_one_line(
        tmp_path, plugin_module):
    """Its snapshot goes into the checkpoint as MIFA's does; its close's model is checked (round 2 returns junk)."""
    from flexfl.errors import PluginError

    name = plugin_module(KEEPS_LAST)
    cfg = _mifa_config(tmp_path, strategy=f"{name}:KeepsLastB")
    eng = RoundEngine(cfg, data=build_federated(cfg.partition))
    thread = threading.Thread(target=eng.run, daemon=True)
    _join(eng, "a")
    _join(eng, "b")
    thread.start()
    try:
        _wait_for(lambda: eng.current is not None and eng.current.round_id == 1, "round 1 to open")
        _answer(eng, "a", 1.0)
        _answer(eng, "b", 3.0)
        thread.join(timeout=60)
        assert eng.finished
    finally:
        eng.stop()
    before = eng.federation.memory.snapshot()
    assert set(before["last"]) == {"a", "b"}
    resumed = RoundEngine(replace(cfg, run=replace(cfg.run, rounds=2)), data=build_federated(cfg.partition),
                          resume=True)
    try:
        after = resumed.federation.memory.snapshot()["last"]
        for device, update in before["last"].items():
            for tensor, value in update.items():
                torch.testing.assert_close(after[device][tensor], value)
                torch.testing.assert_close(value, torch.full_like(value, 1.0 if device == "a" else 3.0))
        weighing = resumed.federation.weigh(2, {})
        with pytest.raises(PluginError, match=rf"^strategy plug-in '{name}:KeepsLastB' returned \['w'\] from its "
                                              r"memory's close in round 2; expected the model's tensors \["):
            resumed.federation.close_summed(weighing, summed=resumed.federation.start_sum(resumed.federation.open(2)))
    finally:
        resumed.stop()
        resumed.folder.release()


def test_one_round_through_domain_records_alone(tmp_path):
    """A join, a round with an upload and the close, with the engine's own records: no gRPC, no protobuf."""
    cfg = CoordinatorConfig(
        server=ServerConfig(fleet_token="t"), partition=PartitionSpec(dataset="synthetic", n_devices=4,
                                                                      total_samples=800),
        rules=RulesConfig(required_updates=E), run=RunConfig(rounds=1, deadline_s=60.0, min_devices=1),
        output=OutputConfig(dir=str(tmp_path / "out")))
    eng = RoundEngine(cfg, data=build_federated(cfg.partition))
    joined = eng.join(Join(device_id="solo", shard_index=2))
    assert (joined.device_index, joined.arrival, joined.current_round) == (2, False, 0)  # seeded by its shard
    start = {n: p.clone() for n, p in eng.params.items()}
    thread = threading.Thread(target=eng.run, daemon=True)
    thread.start()
    try:
        offer = _pull(eng, "solo", wait_s=30)
        assert (offer.status, offer.round_id) == (OfferStatus.ROUND, 1)
        terms = offer.terms
        assert (terms.required_updates, terms.deadline_s, terms.device_index) == (E, 60.0, 2)
        assert terms.params.keys() == start.keys()
        eng.delivered("solo", 1, nbytes=1234)
        delta = {n: np.full(p.shape, 0.25, dtype=np.float32) for n, p in start.items()}
        accepted = eng.push("solo", UpdateReport(round_id=1, updates_completed=E, samples_used=30, train_s=0.5,
                                                 local_loss=1.5, stop_reason=StopReason.COMPLETE,
                                                 resident_bytes=123_456_789), delta, bytes_in=999)
        assert (accepted.round_id, accepted.message) == (1, f"s = {E} accepted")
        thread.join(timeout=60)
        assert eng.finished and _pull(eng, "solo", wait_s=0).status is OfferStatus.FINISHED
    finally:
        eng.stop()
    for n, p in eng.params.items():  # the only member, complete: w + delta
        torch.testing.assert_close(p, start[n] + 0.25)
    state = eng.status()
    assert (state.completed_round, state.open_round, state.finished) == (1, 0, True)
    devices = [(d.device_id, d.shard_index, d.in_objective, d.connected) for d in state.devices]
    assert devices == [("solo", 2, True, True)]
    # What Status shows of it: the resident memory its update reported, and its part in the closed round.
    (solo,) = state.devices
    assert (state.required_updates, solo.resident_bytes, solo.round_state, state.round_closes_in_s) == (
        E, 123_456_789, "", None)
    assert solo.last_round == DeviceRound(round_id=1, s=E, stop_reason="complete", bytes_in=999, bytes_out=1234,
                                          train_s=0.5)
    row = read_metrics(eng.out_dir / "metrics.jsonl")[0]
    assert (row.s, row.live.bytes_in, row.live.bytes_out, row.live.close_reason, row.stop_reason) == \
        ({"solo": E}, {"solo": 999}, {"solo": 1234}, "all answered", {"solo": "complete"})


def test_the_wire_format_stops_at_the_servicer():
    """The engine imports no protobuf or gRPC module; in coordinator/ only the servicer's modules import a protobuf
    module: server.py and the two it hands a round's transfers to (offering.py, uploading.py)."""
    import ast
    import os
    import subprocess
    import sys
    from pathlib import Path

    import coordinator

    root = str(Path(coordinator.__file__).parent.parent)  # this checkout's, not an installed copy's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    loaded = subprocess.run([sys.executable, "-c", "import sys, coordinator.engine; "
                             "print(sorted(m for m in sys.modules "
                             "if m.split('.')[0] in ('grpc', 'google') or m.startswith('flexfl.proto')))"],
                            capture_output=True, text=True, check=True, env=env).stdout.strip()
    assert loaded == "[]"
    wire = {"flexfl.proto.fleet_pb2", "flexfl.proto.fleet_pb2_grpc", "flexfl.proto.tensors"}
    importers = set()
    for path in Path(coordinator.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names] + [node.module]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
            if wire & set(names):
                importers.add(path.name)
    assert importers == {"server.py", "offering.py", "uploading.py"}


EVALUATION_FAILS = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, in_features, num_classes):
            super().__init__()
            self.fc = nn.Linear(in_features, num_classes)

        def forward(self, x):
            if not torch.is_grad_enabled():  # its first call and training pass; testing a closed round fails
                raise RuntimeError("cannot evaluate")
            return self.fc(x)
"""


def test_a_plug_in_model_that_fails_mid_run_stops_the_engine_in_one_line_and_checkpoints_no_unwritten_round(
        tmp_path, plugin_module):
    """Rounds 1 and 2 close; testing round 1 raises in the plug-in. Before, the engine thread died with a
    RuntimeError wrapping it and the final checkpoint held round 2, whose rows (and round 1's) were never written."""
    from coordinator.checkpoint import checkpointed_round
    from flexfl.errors import PluginError

    name = plugin_module(EVALUATION_FAILS)
    cfg = CoordinatorConfig(
        server=ServerConfig(fleet_token="t", pull_wait_s=60.0),
        partition=PartitionSpec(dataset="synthetic", n_devices=4, total_samples=800),
        rules=RulesConfig(required_updates=E, model=f"{name}:Net"),
        run=RunConfig(rounds=3, deadline_s=60.0, min_devices=2), output=OutputConfig(dir=str(tmp_path / "out")))
    eng = RoundEngine(cfg, data=build_federated(cfg.partition))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            eng.run()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    _join(eng, "a")
    _join(eng, "b")
    thread.start()
    for tau in (1, 2):
        _wait_for(lambda tau=tau: eng.current is not None and eng.current.round_id == tau, f"round {tau} to open")
        if tau == 2:
            # Round 1 is tested once round 2 is open; round 2 closes only after that test has failed, else
            # round 3 would open first and wait out its 60 s deadline (the race made this test flaky).
            _wait_for(lambda: eng.finisher.failed is not None, "round 1's evaluation to fail")
        _answer(eng, "a", 1.0)
        _answer(eng, "b", 3.0)
    thread.join(timeout=60)
    assert not thread.is_alive() and len(failures) == 1
    assert isinstance(failures[0], PluginError)
    assert str(failures[0]) == (f"model plug-in '{name}:Net' raised RuntimeError: cannot evaluate in forward "
                                f"({name}.py:12)")
    rows = read_metrics(eng.out_dir / "metrics.jsonl")
    checkpoint = eng.checkpoint_path
    assert rows == [] and (not checkpoint.exists() or checkpointed_round(checkpoint) == 0)


def test_a_plug_in_that_fails_at_load_leaves_no_output_folder(tmp_path, plugin_module):
    """The model is built and run once on zeros before the coordinator claims its output folder."""
    from coordinator.runtime import Coordinator
    from flexfl.errors import PluginError

    name = plugin_module("""
        from torch import nn

        def Net(in_features, num_classes):
            return nn.Linear(in_features, num_classes + 1)
    """)
    cfg = CoordinatorConfig(
        server=ServerConfig(listen="127.0.0.1:0", fleet_token="t"),
        partition=PartitionSpec(dataset="synthetic", n_devices=4, total_samples=800),
        rules=RulesConfig(model=f"{name}:Net"), output=OutputConfig(dir=str(tmp_path / "out")))
    with pytest.raises(PluginError, match=rf"^model plug-in '{name}:Net' returned logits of shape \[2, 11\]"):
        Coordinator(cfg)
    assert not (tmp_path / "out").exists()
