"""FlexFL's deadline rule in a Flower ClientApp (edge_agent.flower_client), on Flower's Simulation Engine with
FlexFL's strategy (flower_apps.py's "client" scenario, in a process of its own): a client whose local updates take
50 ms stops before E when the deadline cannot hold them all and says "compute"; one whose updates take no time
runs all E; the strategy records both."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is FlexFL's [flower] extra (make setup installs it with the dev extra)")

from .test_flower_strategy import simulate

E = 40  # flower_apps.CLIENT_E


@pytest.mark.slow
def test_the_deadline_rule_cuts_a_slow_clients_round_short_and_the_strategy_records_why(tmp_path: Path) -> None:
    result = simulate("client", tmp_path)
    records = result["records"]
    assert [r.round for r in records] == [1, 2, 3]
    slow = next(d for d, n in result["sample_counts"].items() if n == 100)
    for r in records:
        fast = next(d for d in r.participants if d != slow)
        # 0.6 s at >= 50 ms an update: at most 12 (the margin and the clock take some), at least one
        assert 1 <= r.s[slow] <= 12 and r.stop_reason[slow] == "compute", (r.round, r.s, r.stop_reason)
        assert r.s[fast] == E and r.stop_reason[fast] == "complete", (r.round, r.s, r.stop_reason)
