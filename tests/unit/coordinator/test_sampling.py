"""Client sampling (coordinator.rules.sampling): the seeded draw, its expansion of the weights against a numpy
oracle, unbiasedness over many draws, K = N equal to today's rounds bit for bit, and bad values refused."""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from coordinator.cli import add_rules_flags
from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Departure, Federation
from coordinator.rules.round_record import RoundRecord
from coordinator.rules.sampling import ClientSampler
from coordinator.rules.strategies import strategy_names
from flexfl.config import load_config, overrides_from_args, to_dict
from flexfl.errors import ConfigError, RoundStateError
from flexfl.run_spec import RunSpec
from simulator.engine import SimConfig, TracesConfig, run_simulation
from workloads.partition_spec import PartitionSpec

E = 4
N_SAMPLES = {"d0": 10, "d1": 30, "d2": 20, "d3": 15, "d4": 5, "d5": 20}  # p = n_k / 100
DEVICES = list(N_SAMPLES)


def _federation(seed: int = 0, **rules) -> Federation:
    fed = Federation(rules=RulesConfig(required_updates=E, eta0=1.0, **rules), dataset="synthetic",
                     params={"w": torch.zeros(3, dtype=torch.float64)}, seed=seed)
    fed.apply_events(arrivals=[Arrival(d, n) for d, n in N_SAMPLES.items()])
    return fed


# -- the draw ---------------------------------------------------------------------------------------


def test_a_draw_is_a_function_of_seed_round_and_pool_not_of_the_pools_order():
    sampler = ClientSampler(k=3, seed=5)
    p = np.full(6, 1 / 6)
    draws = [sampler.draw(round_index=tau, pool=DEVICES, p=p).devices for tau in range(1, 41)]
    assert all(len(d) == 3 == len(set(d)) for d in draws)
    assert sampler.draw(round_index=7, pool=DEVICES[::-1], p=p).devices == draws[6]  # join order does not matter
    assert len(set(draws)) > 10  # the rounds draw differently
    assert [ClientSampler(k=3, seed=6).draw(round_index=t, pool=DEVICES, p=p).devices for t in range(1, 41)] != draws
    every = ClientSampler(k=9, seed=5).draw(round_index=1, pool=DEVICES, p=p)  # K > N: clamped to every device
    assert every.devices == tuple(sorted(DEVICES)) and set(every.expansion.values()) == {1.0}


def test_weighted_draws_count_repeats_and_follow_p():
    p = np.array([n / 100 for n in N_SAMPLES.values()])
    sampler = ClientSampler(k=4, how="weighted", seed=0)
    drawn = np.zeros(6)
    for tau in range(1, 3001):
        d = sampler.draw(round_index=tau, pool=DEVICES, p=p)
        assert sum(d.counts.values()) == 4
        for dev, m in d.counts.items():
            drawn[DEVICES.index(dev)] += m
            assert d.expansion[dev] == pytest.approx(m / (4 * p[DEVICES.index(dev)]))  # g = m / (K P_k)
    # Each device's share of the 12,000 draws is its p_k (binomial standard error < 0.0042)
    np.testing.assert_allclose(drawn / drawn.sum(), p, atol=0.015)


# -- the coefficients against a numpy oracle ---------------------------------------------------------


def _oracle(strategy: str, how: str, *, s: np.ndarray, p: np.ndarray, counts: dict[str, int], k: int) -> np.ndarray:
    """The sampled coefficients from the formulas of coordinator.rules.sampling's docstring, written out apart."""
    n = len(s)
    m = np.array([counts.get(d, 0) for d in DEVICES], dtype=np.float64)
    drawn = m > 0
    # uniform: 1 / pi_k with pi_k = K / N; weighted: m_k / (K P_k) with P_k = p_k / sum p
    g = np.where(drawn, n / k, 0.0) if how == "uniform" else m * p.sum() / (k * p)
    if strategy == "scheme-c":
        return g * np.where(s > 0, E / np.maximum(s, 1), 0.0) * p
    if strategy == "scheme-b":
        return g * (s > 0) * p
    complete_drawn = int(((s == E) & drawn).sum())  # scheme-a, uniform: N p_k q_k / K^S
    return np.zeros(n) if complete_drawn == 0 else np.where(drawn, n * p * (s == E) / complete_drawn, 0.0)


def _full(strategy: str, *, s: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Full participation's coefficients (paper Section 4.1)."""
    if strategy == "scheme-c":
        return np.where(s > 0, E / np.maximum(s, 1), 0.0) * p
    if strategy == "scheme-b":
        return (s > 0) * p
    return len(s) * p * (s == E) / (s == E).sum()


CASES = [("scheme-c", "uniform"), ("scheme-b", "uniform"), ("scheme-a", "uniform"), ("scheme-c", "weighted"),
         ("scheme-b", "weighted")]


@pytest.mark.parametrize("strategy, how", CASES)
def test_sampled_rounds_match_the_oracle_and_are_unbiased_over_many_draws(strategy, how):
    """Each draw's aggregate equals the oracle's; their mean over many rounds is full participation's aggregate
    (Scheme A: over the rounds it keeps). Without the expansion the mean would miss by a factor N/K = 3."""
    k = 2
    s = np.array([4, 2, 0, 4, 1, 3])
    fed = _federation(strategy=strategy, sample_k=k, client_sampling=how)
    p = fed.weigh(1, {}).p
    deltas = np.random.default_rng(0).normal(size=(6, 3))
    full = _full(strategy, s=s, p=p) @ deltas
    aggregates = []
    for tau in range(1, 1501):
        draw = fed.draw(tau)
        w = fed.weigh(tau, {d: int(v) for d, v in zip(DEVICES, s) if d in draw.counts})
        expected = _oracle(strategy, how, s=s, p=p, counts=dict(draw.counts), k=k)
        np.testing.assert_allclose(w.coefficients.values, expected, rtol=1e-12, atol=0)
        if tau <= 5:  # the model the round makes, stacked as the simulator stacks it
            rows = [d for d in DEVICES if d in draw.counts]
            out = _federation(strategy=strategy, sample_k=k, client_sampling=how).close_stacked(
                w, deltas={"w": torch.tensor(deltas[[DEVICES.index(d) for d in rows]])}, rows=rows)
            np.testing.assert_allclose(out.params["w"].numpy(), expected @ deltas, rtol=1e-12, atol=1e-15)
        if not w.coefficients.discarded:
            aggregates.append(w.coefficients.values @ deltas)
    got = np.array(aggregates)
    sem = got.std(axis=0) / np.sqrt(len(got))
    assert np.all(np.abs(got.mean(axis=0) - full) < 4 * sem + 1e-12), (got.mean(axis=0), full, sem)
    assert np.any(np.abs(got.mean(axis=0) * k / 6 - full) > 4 * sem)  # the check can fail: an unexpanded mean does


def test_uniform_scheme_c_is_exactly_unbiased_over_every_subset():
    """The exact expectation: the mean over all C(6, 3) equally likely draws is full participation's coefficients."""
    s = np.array([4, 2, 0, 4, 1, 3])
    p = np.array([n / 100 for n in N_SAMPLES.values()])
    subsets = list(itertools.combinations(DEVICES, 3))
    mean = np.mean([_oracle("scheme-c", "uniform", s=s, p=p, counts=dict.fromkeys(c, 1), k=3) for c in subsets],
                   axis=0)
    np.testing.assert_allclose(mean, _full("scheme-c", s=s, p=p), rtol=1e-12)


# -- K = N is today's round -------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", strategy_names())
def test_sampling_every_device_is_todays_round_bit_for_bit(strategy):
    """K >= N draws every available device with expansion 1.0: coefficients and models equal to the bit (K = 7:
    N = 6 before the arrival, 7 in round 3, then 6 available), in
    both forms of the round (stacked, summed), through an arrival (fast-reboot) and a departure under include."""
    rules = {"strategy": strategy, **({"mu": 0.1} if strategy == "fedprox" else {})}
    feds = {(form, k): _federation(**rules, **({"sample_k": k} if k else {}))
            for form in ("stacked", "summed") for k in (None, 7, 50)}
    g = torch.Generator().manual_seed(1)
    events = {2: dict(arrivals=[Arrival("d6", 25)]), 3: dict(departures=[Departure("d1", "include")])}
    for tau in range(1, 6):
        openings = {key: fed.open(tau) for key, fed in feds.items()}
        participants = openings["stacked", None].participants
        assert all(o.participants == participants for o in openings.values())
        s = {d: int(v) for d, v in zip(participants, torch.randint(0, E + 1, (8,), generator=g))}
        deltas = {d: torch.randn(3, generator=g, dtype=torch.float64) for d in s}
        weighed = {}
        for (form, k), fed in feds.items():  # each form's plain federation first
            if form == "stacked":
                w = fed.weigh(tau, s)
                fed.close_stacked(w, deltas={"w": torch.stack(list(deltas.values()))}, rows=list(s),
                                  **events.get(tau, {}))
            else:
                summed = fed.start_sum(openings[form, k])
                for d, v in s.items():
                    summed.add(d, s=v, delta={"w": deltas[d].numpy()})
                w = fed.weigh(tau, summed.s)
                fed.close_summed(w, summed=summed, **events.get(tau, {}))
            weighed[form, k] = w
            np.testing.assert_array_equal(w.coefficients.values, weighed[form, None].coefficients.values)
            assert w.coefficients.discarded == weighed[form, None].coefficients.discarded
            assert torch.equal(fed.params["w"], feds[form, None].params["w"]), (form, k, tau)
    assert feds["summed", 7].objective.departed_included == {"d1"}  # the pool left a member out


def test_a_simulation_sampling_every_device_records_todays_rounds():
    cfg = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=4, total_samples=600),
                    rules=RulesConfig(required_updates=3), traces=TracesConfig(num_traces=5), run=RunSpec(rounds=3))
    today = run_simulation(cfg)
    every = run_simulation(replace(cfg, rules=replace(cfg.rules, sample_k=4)))
    for a, b in zip(today.records, every.records, strict=True):
        assert b.sampled == dict.fromkeys(a.participants, 1) and a.sampled is None
        assert replace(b, sampled=None, rules=None, seconds=None) == replace(a, rules=None, seconds=None)
    assert all(torch.equal(today.final_params[n], every.final_params[n]) for n in today.final_params)


# -- the live form, the record, the config ----------------------------------------------------------


def test_summed_sampled_rounds_equal_stacked_ones_and_refuse_undrawn_updates():
    live, batch = _federation(sample_k=3, seed=2), _federation(sample_k=3, seed=2)
    opening = live.open(1)
    assert opening == batch.open(1) and len(opening.participants) == 3
    outside = next(d for d in DEVICES if d not in opening.participants)
    summed = live.start_sum(opening)
    with pytest.raises(RoundStateError, match="not drawn"):
        summed.add(outside, s=E, delta={"w": np.ones(3)})
    with pytest.raises(RoundStateError, match="not drawn"):
        batch.weigh(1, {outside: E})
    s = dict(zip(opening.participants, (4, 1, 3)))
    deltas = {d: torch.randn(3, dtype=torch.float64) for d in s}
    for d, v in s.items():
        summed.add(d, s=v, delta={"w": deltas[d].numpy()})
    w = batch.weigh(1, s)
    out = live.close_summed(live.weigh(1, summed.s), summed=summed)
    batch.close_stacked(w, deltas={"w": torch.stack(list(deltas.values()))}, rows=list(s))
    torch.testing.assert_close(out.params["w"], batch.params["w"], rtol=1e-6, atol=1e-7)
    record = RoundRecord.of(opening, out, test_acc=0.5, test_loss=1.0)
    assert record.sampled == dict.fromkeys(sorted(opening.participants), 1)
    assert RoundRecord.from_json(record.to_json(), where="t").sampled == record.sampled
    assert "sampled" not in RoundRecord.of(_federation().open(1), out, test_acc=0.5, test_loss=1.0).to_json()


@pytest.mark.parametrize("rules, message", [
    ({"sample_k": 0}, "rules.sample_k (K, devices drawn per round) must be an integer >= 1, or left out"),
    ({"sample_k": -3}, "must be an integer >= 1"),
    ({"client_sampling": "weighted"}, "rules.client_sampling = 'weighted' needs rules.sample_k"),
    ({"sample_k": 2, "client_sampling": "proportional"}, "client_sampling: expected one of uniform, weighted"),
])
def test_bad_sampling_values_are_refused_with_one_clear_error(rules, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RulesConfig(**rules)


def test_sampling_reads_from_a_file_and_flags_and_is_written_only_where_set(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text("[rules]\nsample_k = 3\nclient_sampling = \"weighted\"\n")
    read = load_config(SimConfig, path).rules
    assert (read.sample_k, read.client_sampling) == (3, "weighted")
    path.write_text("[rules]\nsample_k = \"three\"\n")
    with pytest.raises(ConfigError, match=r"rules.toml: \[rules\]\.sample_k: expected an integer, got 'three'"):
        load_config(SimConfig, path)
    path.write_text("[rules]\nsample_k = 0\n")
    with pytest.raises(ConfigError, match=r"rules.toml: .*sample_k .* must be an integer >= 1"):
        load_config(SimConfig, path)
    p = argparse.ArgumentParser()
    add_rules_flags(p)
    flags = overrides_from_args(p.parse_args(["--sample-k", "3", "--client-sampling", "weighted"]))["rules"]
    assert RulesConfig(**flags) == read
    assert {"sample_k", "client_sampling"}.isdisjoint(to_dict(RulesConfig()))  # older runs' files stay equal
    assert "client_sampling" not in to_dict(RulesConfig(sample_k=3))
