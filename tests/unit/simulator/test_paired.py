"""run_paired: configs that share data, trained together, give each config's run_simulation result."""

from dataclasses import replace

import pytest
import torch

from coordinator.rules.config import RulesConfig
from flexfl.errors import ConfigError
from flexfl.run_spec import RunSpec
from simulator.engine import (
    ArrivalEvent,
    DepartureEvent,
    ScheduleConfig,
    SimConfig,
    TracesConfig,
    TrainerKind,
    load_data,
    run_paired,
    run_simulation,
)
from workloads.federated import build_federated
from workloads.partition_spec import PartitionSpec

BASE = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=8, total_samples=1200),
                 rules=RulesConfig(required_updates=5), traces=TracesConfig(num_traces=8), run=RunSpec(rounds=6))


def with_rules(cfg: SimConfig, **rules) -> SimConfig:
    return replace(cfg, rules=replace(cfg.rules, **rules))


def assert_same_run(paired, alone):
    """Same model, same per-round records and round rows (s, p, coefficients, events), up to float32 rounding."""
    assert paired.config == alone.config
    for n in alone.final_params:
        torch.testing.assert_close(paired.final_params[n], alone.final_params[n], rtol=1e-5, atol=1e-6)
    assert [r["s"] for r in paired.rows] == [r["s"] for r in alone.rows]
    assert [(r["p"], r["coefficients"]) for r in paired.rows] == [(r["p"], r["coefficients"]) for r in alone.rows]
    events = [(r["arrivals"], r["departures"]) for r in paired.rows]
    assert events == [(r["arrivals"], r["departures"]) for r in alone.rows]
    for a, b in zip(paired.records, alone.records):
        assert (a.round, a.lr, a.active, a.complete, a.members, a.events) == (b.round, b.lr, b.active, b.complete,
                                                                                b.members, b.events)
        assert a.test_loss == pytest.approx(b.test_loss, rel=1e-5) and a.test_acc == pytest.approx(b.test_acc, abs=1e-3)
    assert paired.device_updates == alone.device_updates
    assert paired.trace_assignment == alone.trace_assignment


def test_schemes_a_b_c_trained_together_equal_each_run_alone():
    configs = [with_rules(BASE, scheme=s) for s in "ABC"]
    data = load_data(BASE)
    results = run_paired(configs, data=data)
    for cfg, res in zip(configs, results):
        assert_same_run(res, run_simulation(cfg, data=data))
    # The runs really differ (a pairing that mixed up rows or models would show here too).
    assert results[0].rows[-1]["coefficients"] != results[2].rows[-1]["coefficients"]
    assert any(not torch.equal(results[0].final_params[n], results[2].final_params[n]) for n in results[0].final_params)


def test_strategies_trained_together_equal_each_run_alone():
    data = load_data(BASE)
    fedprox = [replace(BASE, rules=BASE.rules.with_strategy("fedprox", mu=mu)) for mu in (1.0, 0.1)]
    for configs in ([BASE, replace(BASE, rules=BASE.rules.with_strategy("fednova"))],
                    [replace(BASE.with_run(seed=s), rules=BASE.rules.with_strategy("fedprox", mu=1.0)) for s in (0, 2)],
                    # FedProx's rows beside plain SGD's and another mu's in one trainer call (a
                    # strategies page trains every strategy of a seed together)
                    [BASE, *fedprox, replace(BASE, rules=BASE.rules.with_strategy("mifa"))]):
        results = run_paired(configs, data=data)
        for cfg, res in zip(configs, results):
            assert_same_run(res, run_simulation(cfg, data=data))  # FedProx: the plain path runs the same mu
    # mu reaches its own rows only: B (mu = 0) and the two FedProx runs all differ
    finals = [res.final_params[next(iter(res.final_params))] for res in results[:3]]
    assert not torch.equal(finals[0], finals[1]) and not torch.equal(finals[1], finals[2])


def test_fast_reboot_on_and_off_with_an_arrival_equal_each_run_alone():
    events = ScheduleConfig(arrivals=(ArrivalEvent(device=5, round=2), ArrivalEvent(device=6, round=4)),
                            departures=(DepartureEvent(device=0, round=3, policy="include"),))
    base = replace(BASE.with_run(rounds=7), schedule=events)
    # Also: another model seed and fewer rounds (it leaves the lock-step early), and no events
    # at all (no shift of tau_0: its learning rate differs from round 3 on).
    configs = [base, with_rules(base, fast_reboot=False), base.with_run(seed=3, rounds=4),
               replace(base, schedule=ScheduleConfig())]
    data = load_data(base)
    results = run_paired(configs, data=data)
    for cfg, res in zip(configs, results):
        assert_same_run(res, run_simulation(cfg, data=data))
    on, off, short, steady = results
    assert on.rows[2]["p"]["dev-5"] > off.rows[2]["p"]["dev-5"]  # the boost is in one run only
    assert len(short.records) == 4 and short.rows[0]["s"] != on.rows[0]["s"]  # its own seed, its own draws
    assert steady.records[4].lr != on.records[4].lr  # rows of one trainer call at two rates


def test_mnist_mlp_runs_trained_together_equal_each_run_alone(mnist_cache_dir):
    """The MLP kernel trains rows in chunks of 16: rows of three runs share chunks here."""
    base = SimConfig(partition=PartitionSpec(dataset="mnist", n_devices=12, iid=True, total_samples=2400),
                     rules=RulesConfig(required_updates=4, eta0=0.1), traces=TracesConfig(num_traces=8),
                     run=RunSpec(rounds=3))
    data = build_federated(base.partition, cache_dir=mnist_cache_dir)
    configs = [with_rules(base, scheme=s) for s in "ABC"]
    for cfg, res in zip(configs, run_paired(configs, data=data)):
        assert_same_run(res, run_simulation(cfg, data=data))


def test_configs_that_cannot_be_paired_are_refused():
    other_data = replace(BASE, partition=replace(BASE.partition, seed=1))
    with pytest.raises(ConfigError, match=r"config 1 has partition .* paired runs share their data"):
        run_paired([BASE, other_data])
    with pytest.raises(ConfigError, match="config 1 uses the plain trainer"):
        run_paired([BASE, replace(BASE, trainer=TrainerKind.PLAIN)])
    with pytest.raises(ConfigError, match="config 1 has batch size 7"):
        run_paired([BASE, with_rules(BASE, batch_size=7)])
    with pytest.raises(ConfigError, match="at least one config"):
        run_paired([])


def test_rows_sharing_a_generator_train_on_its_batches_each_for_its_own_steps():
    """FastTrainer: rows given one Generator object equal rows given equal fresh Generators."""
    import numpy as np

    from edge_agent.trainer import device_rng
    from simulator.trainers.fast_trainer import FastTrainer
    from workloads.federated import initial_model

    data = load_data(BASE)
    model, params = initial_model("synthetic", seed=0)
    trainer = FastTrainer(model, data.train, batch_size=5)
    shards, steps = [2, 2, 2, 3], [4, 1, 6, 3]  # three rows of device 2 (ragged steps), one of device 3
    shared = device_rng(0, 1, 2)
    got, got_loss = trainer.train(params, shard_of_row=shards, steps=steps, lr=0.5,
                                  rngs=[shared, shared, shared, device_rng(0, 1, 3)])
    want, want_loss = trainer.train(params, shard_of_row=shards, steps=steps, lr=0.5,
                                    rngs=[device_rng(0, 1, k) for k in shards])
    np.testing.assert_array_equal(got_loss, want_loss)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=0, atol=0)
    assert not torch.equal(got["linear.weight"][0], got["linear.weight"][1])  # 4 steps vs 1


def test_an_interrupted_paired_group_resumes_from_its_checkpoint_to_the_same_result(tmp_path, monkeypatch):
    """A worker killed mid-run loses at most the rounds since its last save.

    The resumed runs equal uninterrupted ones."""
    from simulator import engine

    events = ScheduleConfig(arrivals=(ArrivalEvent(device=5, round=2),),
                            departures=(DepartureEvent(device=0, round=4, policy="exclude"),))
    configs = [with_rules(replace(BASE, schedule=events), scheme=s) for s in "ABC"]
    data = load_data(BASE)
    whole = run_paired(configs, data=data)
    checkpoint = tmp_path / "group.partial.pt"
    original_end = engine._Run.end

    def killed_in_round_5(self, work, *args, **kwargs):
        if work.opening.round_index == 5:
            raise KeyboardInterrupt  # what a stopped session does to a worker
        return original_end(self, work, *args, **kwargs)

    monkeypatch.setattr(engine._Run, "end", killed_in_round_5)
    with pytest.raises(KeyboardInterrupt):
        run_paired(configs, data=data, checkpoint=checkpoint, checkpoint_every_s=0)
    assert checkpoint.is_file()
    monkeypatch.setattr(engine._Run, "end", original_end)
    opened = []
    original_begin = engine._Run.begin
    monkeypatch.setattr(engine._Run, "begin", lambda self, tau: opened.append(tau) or original_begin(self, tau))
    resumed = run_paired(configs, data=data, checkpoint=checkpoint, checkpoint_every_s=0)
    assert sorted(set(opened)) == [5, 6]  # rounds 1-4 came from the checkpoint
    for a, b in zip(resumed, whole):
        assert_same_run(a, b)
    # A checkpoint of other configs is not used.
    other = [c.with_run(seed=9) for c in configs]
    opened.clear()
    run_paired(other, data=load_data(other[0]), checkpoint=checkpoint)
    assert min(opened) == 1
