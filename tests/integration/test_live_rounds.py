"""Live rounds on loopback: progress, forced participation equals the simulator, arrivals, departures."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator import uploading
from coordinator.config import with_changes
from coordinator.metrics import read_metrics
from coordinator.rules.aggregation import coefficients
from coordinator.rules.round_record import RoundRecord
from coordinator.rules.strategies import strategy_names
from edge_agent.config import ParticipationConfig
from flexfl.run_spec import RunSpec
from simulator.engine import (
    ArrivalEvent,
    DepartureEvent,
    FixedParticipation,
    ScheduleConfig,
    SimConfig,
    TracesConfig,
    run_simulation,
)
from trace_recorder.format import read_trace_set
from trace_recorder.sampler import assign_traces

from .conftest import make_config

REPO = Path(__file__).resolve().parents[2]


def _records(rows) -> list[RoundRecord]:
    """The simulator's rows as records (JSON objects until the simulator keeps RoundRecords itself)."""
    return [r if isinstance(r, RoundRecord) else RoundRecord.from_json(r, where="simulation") for r in rows]


def _metrics(fleet):
    return read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")


def test_rounds_complete_and_accuracy_rises(live_config, fleet_factory):
    # A deadline the budget cannot reach (5 logreg steps and a 2 KB upload take milliseconds): every
    # device completes E, and each round closes when all have answered, not at the deadline.
    fleet = fleet_factory(live_config(rounds=6, n_devices=3, min_devices=3, iid=True, alpha=0.0, beta=0.0,
                                      total_samples=3000, deadline_s=60.0))
    for i in range(3):
        fleet.start_agent(i)
    assert fleet.coordinator.wait(timeout=60)
    rows = _metrics(fleet)
    assert [r.round for r in rows] == list(range(1, 7))
    assert all(r.s == {f"dev-{i}": 5 for i in range(3)} for r in rows), [r.s for r in rows]
    assert all(set(r.stop_reason.values()) == {"complete"} for r in rows), [r.stop_reason for r in rows]
    assert {r.live.close_reason for r in rows if r.live} == {"all answered"} and all(r.live for r in rows)
    assert rows[-1].test_loss < rows[0].test_loss
    assert rows[-1].test_acc > rows[0].test_acc
    # Bytes on the wire: the model out and the delta in, each at least the model's size.
    model_bytes = sum(p.numel() * 4 for p in fleet.coordinator.engine.params.values())
    assert all(model_bytes <= v < 1.1 * model_bytes for v in rows[-1].live.bytes_out.values())
    assert all(model_bytes <= v < 1.1 * model_bytes for v in rows[-1].live.bytes_in.values())
    assert (fleet.coordinator.out_dir / "checkpoint.pt").exists()


def test_a_device_idled_by_a_slow_upload_tries_again(live_config, fleet_factory):
    """One slow stretch of link must not idle a device for good (found by the soak): an upload
    estimate too long for the deadline makes the device send s = 0, which measures nothing, so
    the estimate decays each such round until the device trains and measures again."""
    fleet = fleet_factory(live_config(rounds=8, n_devices=2, min_devices=2, deadline_s=2.0))

    def after_a_slow_upload(agent):
        agent.estimates.upload_s = 16.0  # as if its last upload had taken 16 s

    fleet.start_agent(0, before_run=after_a_slow_upload)
    fleet.start_agent(1)
    assert fleet.coordinator.wait(timeout=60)
    s0 = [r.s.get("dev-0", 0) for r in _metrics(fleet)]
    assert s0[0] == 0, s0  # the estimate kept it from training
    # 16 -> 8 -> 4 -> 2 -> 1 s: from round 5 it fits the 2 s deadline again.
    assert all(s > 0 for s in s0[5:]), s0


FORCED = [[5, 2, 0, 3], [1, 5, 4, 0], [3, 3, 5, 1]]  # s[round][device], incl. inactive devices


def _live_and_simulated(live_config, fleet_factory, **rules):
    """Four agents forced to FORCED's s for 3 rounds under `rules`, and the simulation of the same schedule."""
    cfg = live_config(rounds=3, n_devices=4, min_devices=4, deadline_s=30.0, **rules)
    fleet = fleet_factory(cfg)
    for i in range(4):
        fleet.start_agent(i, participation=ParticipationConfig(forced_updates=tuple(row[i] for row in FORCED)))
    assert fleet.coordinator.wait(timeout=60)
    sim = run_simulation(SimConfig(partition=cfg.partition, rules=cfg.rules, run=RunSpec(rounds=3, seed=cfg.run.seed)),
                         participation=FixedParticipation(FORCED, E=cfg.rules.required_updates))
    return cfg, fleet, sim


@pytest.mark.parametrize("inline_uploads, worker", [(uploading.INLINE_UPLOADS, "grpc-server"), (0, "upload")])
def test_live_model_equals_simulated_model_under_forced_participation(live_config, fleet_factory, wait_for,
                                                                      monkeypatch, inline_uploads, worker):
    """Also for both places an upload is summed: the event loop (few uploads in progress, the
    default here) and the work threads (what a busier server uses)."""
    monkeypatch.setattr(uploading, "INLINE_UPLOADS", inline_uploads)
    threads = []
    push = uploading.Uploads._push

    def recording_push(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return push(self, *args, **kwargs)

    monkeypatch.setattr(uploading.Uploads, "_push", recording_push)
    _cfg, fleet, sim = _live_and_simulated(live_config, fleet_factory, scheme="C")
    live = fleet.coordinator.engine.params
    for name, value in sim.final_params.items():
        # Agents train per device, the simulator all devices at once: float32 rounding apart.
        torch.testing.assert_close(live[name], value, rtol=1e-3, atol=1e-4)
    rows = _metrics(fleet)
    assert [[r.s[f"dev-{i}"] for i in range(4)] for r in rows] == FORCED
    np.testing.assert_allclose([r.test_acc for r in rows], [r.test_acc for r in sim.records], atol=1e-6)
    assert len(threads) == 12 and all(name.startswith(worker) for name in threads), threads


@pytest.mark.parametrize("strategy", [s for s in strategy_names() if s != "scheme-c"])  # C: the test above
def test_live_model_equals_simulated_model_under_every_strategy(live_config, fleet_factory, strategy):
    """The coordinator sums each strategy's updates as they arrive, the simulator stacks them: the same model.

    FedProx also changes training: the agents (edge_agent.trainer) and the simulator's row
    trainer both run its proximal term, with the mu the coordinator sends in each round."""
    mu = {"mu": 2.0} if strategy == "fedprox" else {}  # large, so that the term shows in 3 rounds
    cfg, fleet, sim = _live_and_simulated(live_config, fleet_factory, strategy=strategy, **mu)
    rows = _metrics(fleet)
    assert [[r.s[f"dev-{i}"] for i in range(4)] for r in rows] == FORCED
    for live_row, sim_row, s in zip(rows, _records(sim.rows), FORCED, strict=True):
        assert live_row.coefficients == pytest.approx(sim_row.coefficients)
        p = [live_row.p[f"dev-{i}"] for i in range(4)]
        # The strategy's own coefficients, not Scheme C's, reached the live round.
        expected = coefficients(strategy, s=s, E=cfg.rules.required_updates, p=p).values
        np.testing.assert_allclose([live_row.coefficients[f"dev-{i}"] for i in range(4)], expected, rtol=1e-9)
        if strategy != "mifa":  # MIFA's this-round coefficients are Scheme C's; its memories are checked below
            assert not np.allclose(expected, coefficients("C", s=s, E=cfg.rules.required_updates, p=p).values)
    live = fleet.coordinator.engine.params
    for name, value in sim.final_params.items():
        # Agents train per device, the simulator all devices at once: float32 rounding apart.
        torch.testing.assert_close(live[name], value, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose([r.test_acc for r in rows], [r.test_acc for r in sim.records], atol=1e-6)
    if strategy == "mifa":  # dev-3, inactive in round 2, applied its round-1 memory on both sides: not Scheme C
        assert [r.remembered for r in rows] == [r.remembered for r in _records(sim.rows)] == \
            [("dev-0", "dev-1", "dev-3"), ("dev-0", "dev-1", "dev-2", "dev-3"), ("dev-0", "dev-1", "dev-2", "dev-3")]
        plain = run_simulation(SimConfig(partition=cfg.partition, rules=cfg.rules.with_strategy("C"),
                                         run=RunSpec(rounds=3, seed=cfg.run.seed)),
                               participation=FixedParticipation(FORCED, E=5))
        assert not all(torch.allclose(live[n], v, rtol=1e-3, atol=1e-4) for n, v in plain.final_params.items())
    if mu:  # the term was there on both sides: without it (Scheme B) the model is another
        plain = run_simulation(SimConfig(partition=cfg.partition, rules=cfg.rules.with_strategy("B"),
                                         run=RunSpec(rounds=3, seed=cfg.run.seed)),
                               participation=FixedParticipation(FORCED, E=5))
        assert not all(torch.allclose(live[n], v, rtol=1e-3, atol=1e-4) for n, v in plain.final_params.items())


def test_fednova_under_epochs_counts_each_devices_steps_live_and_simulated(live_config, fleet_factory):
    """s counts epochs here; FedNova's tau_k are SGD steps, s_k ceil(n_k / B), on both sides."""
    # eta_0 = 0.05: at SYNTHETIC's paper rate of 1, up to 5 epochs of steps per round amplify
    # float32 rounding until even the simulator's own trainers differ by 1e-2 (they agree to 1e-7 here)
    cfg, fleet, sim = _live_and_simulated(live_config, fleet_factory, strategy="fednova", unit="epoch", eta0=0.05)
    rows = _metrics(fleet)
    assert [[r.s[f"dev-{i}"] for i in range(4)] for r in rows] == FORCED  # recorded in epochs
    for live_row, sim_row, s in zip(rows, _records(sim.rows), FORCED, strict=True):
        assert live_row.coefficients == pytest.approx(sim_row.coefficients)
        p = [live_row.p[f"dev-{i}"] for i in range(4)]
        # Reading the epochs as steps would give other coefficients (the devices' sizes differ)
        as_steps = coefficients("fednova", s=s, E=cfg.rules.required_updates, p=p).values
        assert not np.allclose([live_row.coefficients[f"dev-{i}"] for i in range(4)], as_steps)
    live = fleet.coordinator.engine.params
    for name, value in sim.final_params.items():
        torch.testing.assert_close(live[name], value, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("rules, refused",
                         [({"strategy": "fedprox", "mu": 0.1}, True), ({"strategy": "scheme-b"}, False)])
def test_a_fedprox_run_refuses_agents_that_would_train_without_its_term(live_config, fleet_factory, rules, refused):
    """Protocol 1 agents do not know RoundHeader.proximal_mu: they would run plain SGD and call it FedProx."""
    import grpc
    from flexfl.proto import fleet_pb2 as pb
    from flexfl.proto import fleet_pb2_grpc as pb_grpc
    from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, PROTOCOL_VERSION

    from .conftest import TOKEN

    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=2, **rules))
    with grpc.insecure_channel(f"127.0.0.1:{fleet.port}") as channel:
        stub = pb_grpc.FleetStub(channel)
        md = [(AUTH_HEADER, f"Bearer {TOKEN}"), (DEVICE_HEADER, "dev-0")]
        old = pb.JoinRequest(device_id="dev-0", sample_count=100, protocol_version=1)
        if refused:
            with pytest.raises(grpc.RpcError) as info:
                stub.Join(old, metadata=md, timeout=5)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "FedProx's mu = 0.1, which agents of protocol version 1 ignore" in info.value.details()
            old.protocol_version = PROTOCOL_VERSION  # a current agent joins
        assert stub.Join(old, metadata=md, timeout=5).device_id == "dev-0"


@pytest.mark.parametrize("policy", ["exclude", "include"])
def test_live_run_with_traces_arrival_and_departure_equals_its_simulation(live_config, fleet_factory, wait_for,
                                                                         policy):
    """Agents follow traces; dev-4 arrives (fast-reboot), dev-0 departs: the simulator ends with the same model
    and the same Gamma estimate for dev-0."""
    n, rounds = 5, 8
    cfg = live_config(rounds=rounds, n_devices=n, min_devices=n - 1, deadline_s=30.0, scheme="C",
                      departure_policy=policy, total_samples=2000, seed=3)
    fleet = fleet_factory(cfg)
    traces = read_trace_set(REPO / "traces" / "paper").first(5)
    assignment = assign_traces(n, n_traces=len(traces), seed=cfg.run.seed)
    for i in range(n):
        fleet.start_agent(i, participation=ParticipationConfig(
            trace=f"{REPO / 'traces' / 'paper'}:{traces[assignment[i]].name}",
            # dev-0 is the fast one, so its departure reaches the coordinator before round 5 closes.
            min_update_s=0.0 if i == 0 else 0.03,
            join_in_round=3 if i == n - 1 else 0, leave_after_round=5 if i == 0 else 0))
    assert fleet.coordinator.wait(timeout=120)
    rows = _metrics(fleet)
    arrival = next(r.round for r in rows if r.arrivals)
    departure = next(r.round for r in rows if r.departures)
    assert (arrival, departure) == (3, 5)  # the scripted rounds
    sim = run_simulation(SimConfig(
        partition=cfg.partition, rules=cfg.rules, run=RunSpec(rounds=rounds, seed=cfg.run.seed),
        traces=TracesConfig(set=str(REPO / "traces" / "paper"), num_traces=5),
        schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=n - 1, round=arrival),),
                                departures=(DepartureEvent(device=0, round=departure),))))
    # The same s per device per round (one trace sampler), p, coefficients and rates ...
    for live_row, sim_row in zip(rows, _records(sim.rows), strict=True):
        assert live_row.s == sim_row.s, live_row.round
        assert sorted(live_row.participants) == sorted(sim_row.participants)
        assert live_row.p == pytest.approx(sim_row.p), live_row.round
        assert live_row.coefficients == pytest.approx(sim_row.coefficients), live_row.round
        assert live_row.lr == pytest.approx(sim_row.lr)
        # The departed device's Gamma estimate: from updates summed as they arrived, and stacked.
        assert live_row.departure_gammas == pytest.approx(sim_row.departure_gammas, rel=1e-3, abs=1e-9)
    assert rows[departure - 1].departure_gammas["dev-0"] is not None  # dev-0 contributed in rounds 1-5
    assert any(0 < s < cfg.rules.required_updates for r in rows for s in r.s.values())  # incomplete work
    # ... and the same global model.
    live = fleet.coordinator.engine.params
    for name, value in sim.final_params.items():
        # Agents train per device, the simulator all devices at once: float32 rounding apart.
        torch.testing.assert_close(live[name], value, rtol=1e-3, atol=1e-4)


def test_late_joiner_gets_boosted_coefficient_and_rate_reset(live_config, fleet_factory, wait_for):
    # The arrival is scripted for round 4 (the coordinator holds that round for it): on a loaded
    # machine an agent started after round 3 could otherwise join too late for rounds 5-6 to exist.
    cfg = with_changes(live_config(rounds=8, n_devices=4, min_devices=3, deadline_s=2.0),
                       run={"expected_arrivals": {"dev-3": 4}, "expected_wait_s": 60.0})
    fleet = fleet_factory(cfg)
    for i in range(3):
        fleet.start_agent(i)
    wait_for(lambda: fleet.coordinator.engine.completed_round >= 3, what="round 3")
    fleet.start_agent(3, participation=ParticipationConfig(join_in_round=4))
    assert fleet.coordinator.wait(timeout=60)
    rows = _metrics(fleet)
    arrival = next(r for r in rows if "dev-3" in r.arrivals)
    tau0 = arrival.round
    assert tau0 == 4
    first, second = rows[tau0], rows[tau0 + 1]  # rounds tau0 + 1 and tau0 + 2
    n = fleet.coordinator.engine.objective.sample_counts
    p_l = n["dev-3"] / sum(n.values())
    assert first.p["dev-3"] == pytest.approx(3 * p_l)  # fast-reboot: 3 p_l at arrival
    assert second.p["dev-3"] == pytest.approx(p_l * (1 + 2 / 4))  # decaying as (r + 1)^-2
    eta0 = cfg.eta0
    assert first.lr == pytest.approx(eta0)  # eta_0 / (tau - tau_0) restarts
    assert second.lr == pytest.approx(eta0 / 2)
    assert rows[tau0 - 1].lr == pytest.approx(eta0 / tau0)
    # The existing devices' weights were renormalised over the enlarged objective.
    assert first.p["dev-0"] == pytest.approx(n["dev-0"] / sum(n.values()))
    assert first.s["dev-3"] > 0 and first.coefficients["dev-3"] > 0


@pytest.mark.parametrize("policy", ["include", "exclude"])
def test_departure_policy_changes_p_as_specified(live_config, fleet_factory, policy):
    # Scripted (the agent leaves after uploading in round 3, and round 3 is held for its Leave):
    # a stop() after round 2 was once overtaken by all seven millisecond rounds on a loaded machine.
    cfg = with_changes(live_config(rounds=7, n_devices=3, min_devices=3, departure_policy=policy),
                       run={"expected_departures": {"dev-2": 3}})
    fleet = fleet_factory(cfg)
    for i in range(3):
        fleet.start_agent(i, participation=ParticipationConfig(leave_after_round=3 if i == 2 else 0))
    assert fleet.coordinator.wait(timeout=60)
    rows = _metrics(fleet)
    dep = next(r for r in rows if "dev-2" in r.departures)
    assert dep.round == 3  # the scripted round
    after = rows[dep.round]  # first round after the departure took effect
    n = {d: len(fleet.agents[d][0].shard) for d in ("dev-0", "dev-1", "dev-2")}
    if policy == "include":
        assert after.p["dev-2"] == pytest.approx(n["dev-2"] / sum(n.values()))
        assert after.s["dev-2"] == 0 and after.coefficients["dev-2"] == 0
        assert after.lr == pytest.approx(cfg.eta0 / after.round)
    else:
        assert "dev-2" not in after.p
        assert after.p["dev-0"] == pytest.approx(n["dev-0"] / (n["dev-0"] + n["dev-1"]))
        assert after.lr == pytest.approx(cfg.eta0)  # objective shift
    assert "dev-2" not in after.participants


def test_live_emnist_run_from_a_user_given_folder(tmp_path, fleet_factory, make_emnist, monkeypatch):
    """EMNIST live: the coordinator reads it from emnist_root; one agent finds it in its cache folder,
    the other is told where by its own [partition]."""
    root = tmp_path / "emnist-here"
    make_emnist(root / "EMNIST" / "raw", n_train=300, n_test=60)
    cache = tmp_path / "cache"
    make_emnist(cache / "emnist" / "raw", n_train=300, n_test=60)
    monkeypatch.setenv("FLEXFL_CACHE", str(cache))
    cfg = make_config(tmp_path, dataset="emnist", emnist_root=str(root), n_devices=2, iid=True, sizes="equal",
                      total_samples=None, min_devices=2, rounds=2, required_updates=2, deadline_s=30.0)
    fleet = fleet_factory(cfg)
    fleet.start_agent(0)
    fleet.start_agent(1, partition=replace(cfg.partition, emnist_root=str(root)))
    assert fleet.coordinator.wait(timeout=120)
    rows = _metrics(fleet)
    assert [r.round for r in rows] == [1, 2]
    assert all(r.s == {"dev-0": 2, "dev-1": 2} for r in rows)
    assert fleet.coordinator.engine.model_description.architecture == "cnn"
    assert {len(a.shard) for a, _ in fleet.agents.values()} == {150}


@pytest.mark.parametrize("sampling, k", [("uniform", 2), ("weighted", 3)])
def test_live_run_with_client_sampling_equals_its_simulation(live_config, fleet_factory, sampling, k):
    """K of 5 devices per round, drawn by the one rule (coordinator.rules.sampling) from the run's seed: the
    coordinator offers the model to the drawn devices only, the simulator trains only them; the same draws,
    s, expanded coefficients and model."""
    n, rounds = 5, 5
    cfg = live_config(rounds=rounds, n_devices=n, min_devices=n, deadline_s=30.0, scheme="C", total_samples=2000,
                      seed=3, sample_k=k, client_sampling=sampling)
    fleet = fleet_factory(cfg)
    traces = read_trace_set(REPO / "traces" / "paper").first(5)
    assignment = assign_traces(n, n_traces=len(traces), seed=cfg.run.seed)
    for i in range(n):
        fleet.start_agent(i, participation=ParticipationConfig(
            trace=f"{REPO / 'traces' / 'paper'}:{traces[assignment[i]].name}"))
    assert fleet.coordinator.wait(timeout=120)
    rows = _metrics(fleet)
    sim = run_simulation(SimConfig(partition=cfg.partition, rules=cfg.rules,
                                   run=RunSpec(rounds=rounds, seed=cfg.run.seed),
                                   traces=TracesConfig(set=str(REPO / "traces" / "paper"), num_traces=5)))
    for live_row, sim_row in zip(rows, _records(sim.rows), strict=True):
        assert live_row.sampled == sim_row.sampled and sum(live_row.sampled.values()) == k, live_row.round
        assert sorted(live_row.participants) == sorted(sim_row.participants) == sorted(live_row.sampled)
        assert live_row.s == sim_row.s, live_row.round
        # A device not drawn was not offered the model: s = 0, coefficient 0, and its agent says nothing
        left_out = set(live_row.devices) - set(live_row.sampled)
        assert left_out and all(live_row.s[d] == 0 == live_row.coefficients[d] for d in left_out)
        assert all(live_row.stop_reason[d] == "offline" for d in left_out), live_row.stop_reason
        assert live_row.coefficients == pytest.approx(sim_row.coefficients), live_row.round
    assert len({tuple(sorted(r.sampled)) for r in rows}) > 1  # the rounds drew different devices
    if sampling == "uniform":  # Scheme C's N/K factor on each drawn device's (E/s_k) p_k
        r = rows[0]
        drawn = [d for d in r.sampled if r.s[d] > 0]
        assert drawn and all(r.coefficients[d] == pytest.approx(n / k * cfg.rules.required_updates / r.s[d] * r.p[d])
                             for d in drawn)
    live = fleet.coordinator.engine.params
    for name, value in sim.final_params.items():
        torch.testing.assert_close(live[name], value, rtol=1e-3, atol=1e-4)
