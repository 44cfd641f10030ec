"""DeadlineTraining's clock (edge_agent.flower_client): from the client's start, or from when the strategy made the
message, so that a Flower node's ClientApp start-up (a process per message) is spent from the round's deadline."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("flwr", reason="Flower is FlexFL's [flower] extra (make setup installs it with the dev extra)")

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from edge_agent.flower_client import DeadlineTraining
from flexfl.flower_keys import CONFIG_KEYS
from flexfl.vocabulary import StopReason


@pytest.fixture(autouse=True)
def _a_task() -> Iterator[None]:
    """Flower makes a Message only inside a task (task, run and node ids set), as a ClientApp's are."""
    from flwr.supercore.task_identity import TaskIdentity

    kept = {k: TaskIdentity.__dict__.get(f"_{k}") for k in ("task_id", "run_id", "node_id")}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    yield
    for k, v in kept.items():
        setattr(TaskIdentity, f"_{k}", v)


def _message(*, made_s_ago: float, deadline_s: float, E: int = 50) -> Message:
    config = ConfigRecord({CONFIG_KEYS["round"]: 1, CONFIG_KEYS["E"]: E, CONFIG_KEYS["lr"]: 0.1,
                           CONFIG_KEYS["deadline_s"]: deadline_s})
    msg = Message(RecordDict({"arrays": ArrayRecord({"w": torch.zeros(2)}), "config": config}), dst_node_id=1,
                  message_type="train")
    msg.metadata.created_at = time.time() - made_s_ago
    return msg


def _context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def _run(budget: DeadlineTraining) -> int:
    for _ in budget.updates():
        time.sleep(0.01)
    return budget.s


def test_counted_from_sent_a_message_that_waited_past_its_deadline_gets_no_update() -> None:
    late = _message(made_s_ago=5.0, deadline_s=2.0)
    budget = DeadlineTraining.start(late, _context(), counting_from="sent")
    assert _run(budget) == 0 and budget.stop_reason in (StopReason.COMPUTE, StopReason.UPLOAD)


def test_counted_from_the_start_the_same_message_trains_until_its_own_deadline() -> None:
    late = _message(made_s_ago=5.0, deadline_s=0.5)
    budget = DeadlineTraining.start(late, _context())
    s = _run(budget)
    assert 0 < s < 50 and budget.stop_reason is StopReason.COMPUTE


def test_counted_from_sent_the_time_already_spent_shortens_the_round() -> None:
    fresh = _run(DeadlineTraining.start(_message(made_s_ago=0.0, deadline_s=1.5, E=1000), _context(),
                                        counting_from="sent"))
    waited = _run(DeadlineTraining.start(_message(made_s_ago=0.75, deadline_s=1.5, E=1000), _context(),
                                         counting_from="sent"))
    assert 0 < waited < fresh < 1000, (waited, fresh)


def test_an_unknown_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="counting_from must be 'start' or 'sent'"):
        DeadlineTraining.start(_message(made_s_ago=0.0, deadline_s=1.0), _context(), counting_from="now")
