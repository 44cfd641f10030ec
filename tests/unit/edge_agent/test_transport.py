"""The agent's wire edge without a server: protobuf in, records out (edge_agent/transport.py)."""

from __future__ import annotations

import pytest
import torch
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import tensors as wire

from edge_agent.device_round import expected_parameters
from edge_agent.transport import _offer
from flexfl.exchange import ModelDescription, OfferStatus
from workloads.models import build_model


def _round_header(params: dict[str, torch.Tensor], **fields) -> tuple[pb.RoundHeader, bytearray]:
    payload, data = wire.encode(params)
    header = pb.RoundHeader(status=pb.RoundHeader.ROUND, round_id=4, required_updates=7, learning_rate=0.05,
                            batch_size=16, deadline_s=2.5, payload=payload, seed=11, device_index=2,
                            proximal_mu=0.01, model=pb.ModelDescription(architecture="logreg", in_features=6,
                                                                       num_classes=3), **fields)
    return header, bytearray(data)


def _params() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {n: p.detach().clone() for n, p in build_model("logreg", in_features=6, num_classes=3).named_parameters()}


def _expected(desc: ModelDescription):
    return expected_parameters(build_model(desc.architecture, in_features=desc.in_features,
                                           num_classes=desc.num_classes))


def test_a_round_header_becomes_the_offer_with_its_model_and_the_wire_defaults_named() -> None:
    params = _params()
    header, data = _round_header(params)
    offer = _offer(header, data, expected=_expected)
    assert (offer.status, offer.round_id) == (OfferStatus.ROUND, 4)
    t = offer.terms
    assert t is not None
    assert (t.required_updates, t.learning_rate, t.batch_size, t.deadline_s, t.seed, t.device_index,
            t.proximal_mu) == (7, 0.05, 16, 2.5, 11, 2, 0.01)
    assert t.model == ModelDescription(architecture="logreg", num_classes=3, in_features=6)
    # Fields an older coordinator leaves empty read as their defaults.
    assert (t.unit, t.trace_sampling, t.s_rule) == ("step", "iid", "round")
    assert set(t.params) == set(params) and all(torch.equal(t.params[n], params[n]) for n in params)
    named = _offer(_round_header(params, unit="epoch", trace_sampling="replay", s_rule="floor")[0], data,
                   expected=_expected).terms
    assert named is not None and (named.unit, named.trace_sampling, named.s_rule) == ("epoch", "replay", "floor")


def test_a_model_that_does_not_fit_the_description_is_refused_at_the_edge() -> None:
    params = _params()
    params["linear.weight"] = torch.zeros(3, 5)  # the description says 6 features
    header, data = _round_header(params)
    with pytest.raises(wire.PayloadError, match=r"linear.weight.*\(3, 5\).*expects \(3, 6\)"):
        _offer(header, data, expected=_expected)


@pytest.mark.parametrize("status, expected", [(pb.RoundHeader.WAIT, OfferStatus.WAIT),
                                              (pb.RoundHeader.FINISHED, OfferStatus.FINISHED),
                                              (pb.RoundHeader.STATUS_UNSPECIFIED, OfferStatus.WAIT)])
def test_headers_without_a_round_carry_no_terms(status: int, expected: OfferStatus) -> None:
    offer = _offer(pb.RoundHeader(status=status, round_id=9), b"", expected=_expected)
    assert (offer.status, offer.round_id, offer.terms) == (expected, 9, None)
