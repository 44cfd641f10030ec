"""The device's round with no coordinator: terms in, update out (s, why it stopped, delta, times) on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_agent.config import ParticipationConfig
from edge_agent.deadline import Estimates
from edge_agent.device_round import RoundCaps, expected_parameters, run_round
from flexfl.exchange import ModelDescription, RoundTerms
from flexfl.vocabulary import StopReason
from workloads.datasets import ArrayDataset
from workloads.models import build_model

E = 5
BATCH = 8
UPDATE_S = 1.0  # each update lasts this long on the fake clock (participation.min_update_s pads it to that)
UPLOAD_S = 0.5
MARGIN_S = 0.25  # an update starts while 1.75 s are left


class FakeClock:
    """A clock that only moves when the device sleeps (its padding to min_update_s)."""

    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("logreg", in_features=12, num_classes=3)


def _terms(params: dict[str, torch.Tensor], *, deadline_s: float = 60.0) -> RoundTerms:
    return RoundTerms(required_updates=E, learning_rate=0.1, batch_size=BATCH, deadline_s=deadline_s,
                      model=ModelDescription(architecture="logreg", num_classes=3, in_features=12), params=params,
                      seed=3, unit="step", device_index=1, trace_sampling="iid", s_rule="round", proximal_mu=0.0)


def _shard() -> ArrayDataset:
    rng = np.random.default_rng(0)
    return ArrayDataset(x=rng.normal(size=(40, 12)).astype(np.float32), y=rng.integers(0, 3, 40))


def _round(deadline_s: float, *, cap: int = E, participation: ParticipationConfig | None = None,
           stopping: bool = False, estimates: Estimates | None = None):
    clock = FakeClock()
    model = _model()
    start = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}  # the global model, not the init
    estimates = estimates or Estimates(update_s=UPDATE_S, upload_s=UPLOAD_S)
    update = run_round(round_id=2, terms=_terms(start), model=model, shard=_shard(), cap=cap,
                       deadline_at=clock.now + deadline_s, estimates=estimates, margin_s=MARGIN_S,
                       participation=participation or ParticipationConfig(min_update_s=UPDATE_S),
                       stopping=lambda: stopping, clock=clock, sleep=clock.sleep)
    return update, model, start, estimates


@pytest.mark.parametrize("deadline_s, expected_s", [
    (1.5, 0),  # 1.5 s < 1 + 0.5 + 0.25: not even the first update starts
    (3.6, 2),  # after 2 updates 1.6 s are left
    (60.0, E),
], ids=["s=0", "0<s<E", "s=E"])
def test_the_round_trains_while_the_deadline_allows_and_says_what_it_did(deadline_s: float, expected_s: int) -> None:
    update, model, start, estimates = _round(deadline_s)
    r = update.report
    assert (r.round_id, r.updates_completed, r.samples_used) == (2, expected_s, expected_s * BATCH)
    assert r.stop_reason == (StopReason.COMPLETE if expected_s == E else StopReason.COMPUTE)
    # Each update lasted UPDATE_S, and only the updates that ran were timed: the update estimate stays put.
    assert r.train_s == pytest.approx(expected_s * UPDATE_S)
    assert estimates.update_s == pytest.approx(UPDATE_S)
    assert r.previous_upload_s == UPLOAD_S
    if expected_s == 0:
        assert update.delta == {} and r.local_loss == 0.0
    else:  # the delta is the model's move from the global model it was handed
        assert set(update.delta) == set(start)
        for n, p in model.named_parameters():
            np.testing.assert_allclose(update.delta[n], (p.detach() - start[n]).numpy(), atol=1e-7)
        assert np.abs(update.delta["linear.weight"]).max() > 0 and r.local_loss > 0


def test_a_cap_below_E_is_the_trace_and_a_stopping_agent_is_stopped() -> None:
    forced = ParticipationConfig(forced_updates=(2,))
    update, *_ = _round(0.0, cap=2, participation=forced)  # forced participation ignores time
    assert (update.report.updates_completed, update.report.stop_reason, update.cap) == (2, StopReason.TRACE, 2)
    update, *_ = _round(60.0, stopping=True)
    assert (update.report.updates_completed, update.report.stop_reason, update.delta) == (0, StopReason.STOPPED, {})


def test_without_training_the_round_reports_its_cap_with_a_zero_delta() -> None:
    update, model, start, _ = _round(60.0, cap=3, participation=ParticipationConfig(no_train=True))
    assert (update.report.updates_completed, update.report.samples_used) == (3, 0)
    assert all(not d.any() for d in update.delta.values()) and set(update.delta) == set(start)
    assert all(torch.equal(p.detach(), start[n]) for n, p in model.named_parameters())  # loaded, not trained


def test_the_caps_follow_the_forced_schedule_cycled_else_E() -> None:
    terms = _terms({})
    caps = RoundCaps(ParticipationConfig(forced_updates=(2, 9, 0)))
    assert [caps.cap(round_id=k, terms=terms) for k in range(1, 6)] == [2, E, 0, 2, E]
    assert RoundCaps(ParticipationConfig()).cap(round_id=4, terms=terms) == E


def test_the_expected_parameters_are_the_models_names_and_shapes_in_float32() -> None:
    assert expected_parameters(_model()) == {"linear.weight": ((3, 12), np.dtype(np.float32)),
                                             "linear.bias": ((3,), np.dtype(np.float32))}


def test_a_round_the_budget_cut_short_still_teaches_the_update_estimate() -> None:
    """A compute-bound device's rounds all end on the budget's no: they are its only measurements.
    Its estimate of 0.5 s is too optimistic for 1 s updates; three run (3.6 s left, then 2.6, 1.6 >= 0.5 +
    0.5 + 0.25; 0.6 is not) and the estimate moves halfway to the measured 1 s."""
    update, _, _, estimates = _round(3.6, estimates=Estimates(update_s=0.5, upload_s=UPLOAD_S))
    assert (update.report.updates_completed, update.report.stop_reason) == (3, StopReason.COMPUTE)
    assert estimates.update_s == pytest.approx(0.5 * 0.5 + 0.5 * UPDATE_S)
