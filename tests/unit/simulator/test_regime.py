"""simulator.paper.regime: where `--eta0 protocol` finds its rates."""

from __future__ import annotations

from pathlib import Path


def test_the_protocol_reads_the_checkouts_committed_operating_points():
    """`--eta0 protocol` looks in the checkout's results/ (simulator/paper/ is two folders below it): the file there,
    with a rate for each dataset and unit the protocol has chosen."""
    from simulator.paper.regime import OPERATING_POINT_FILE, protocol_eta0

    checkout = Path(__file__).resolve().parents[3]
    assert checkout / "results" / "operating_point.toml" == OPERATING_POINT_FILE
    assert OPERATING_POINT_FILE.is_file()
    assert protocol_eta0("synthetic", "epoch") > 0


def test_each_pages_note_names_the_reading_that_agrees_best_with_its_table():
    """Issue 33 item 12: every epoch page, Tables 4 and 5 included, called the epoch reading "FlexFL's
    headline"; results/README.md finds Table 3 best in epochs (at the paper's eta_0), Tables 4-5 in steps."""
    from simulator.paper.regime import Regime

    epoch, step = Regime(unit="epoch", eta0="paper"), Regime()
    assert all("headline" not in r.reading_note(t) for r in (epoch, step) for t in ("Table 3", "Table 4", "Figure 6"))
    assert epoch.reading_note("Table 3").endswith(
        "For Table 3, E in epochs at the paper's eta_0 (results/epoch-paper/) agrees best with the paper "
        "(results/README.md, \"Which reading reproduces which table\")")
    for table in ("Table 4", "Table 5"):
        best = f"For {table}, E in steps (results/) agrees best with the paper"
        assert f"{best}: in epochs the" in epoch.reading_note(table)
        assert f"{best} (results/README.md" in step.reading_note(table)
    assert "agrees best with the paper: in steps fewer cells" in step.reading_note("Table 3")
    assert epoch.reading_note("Figure 6").endswith("compares the readings on Tables 3-5, not on Figure 6")
