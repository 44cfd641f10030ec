"""The bounded part of the fuzzer (benchmarks/fuzz.py; the full run is `make fuzz`): fixed seed, seconds."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis", reason="the fuzzer needs hypothesis (pip install -e '.[dev]')")

from benchmarks import fuzz
from benchmarks.fuzz_config import fuzz_configs


def test_config_parsers_give_a_config_or_a_config_error():
    tally = fuzz_configs(60, random_seed=0)
    parsers = {parser for parser, _ in tally}
    assert parsers == {"coordinator", "agent", "live", "sim", "profile", "inventory", "partition", "partition_json"}
    assert sum(tally.values()) == 8 * 60
    assert {outcome for _, outcome in tally} == {"loaded", "ConfigError"}  # both branches are reached


def test_a_fuzzed_coordinator_still_serves_an_exact_round_without_growing():
    summary = fuzz.run(messages=300, configs=0, random_seed=0, rss_bound_mib=64, log=lambda *_: None)
    assert summary["calls"] == 300
    assert summary["by_kind"].get("PushUpdate", 0) > 50  # updates are the richest surface
    assert "OK" not in {code for kind_code in summary["by_kind_and_code"] for code in [kind_code.split(" -> ")[1]]
                        if kind_code.startswith("PushUpdate ->")}
    codes = {kind_code.split(" -> ")[1] for kind_code in summary["by_kind_and_code"]
             if kind_code.startswith("Session ->")}
    assert summary["by_kind"].get("Session", 0) > 5 and "INVALID_ARGUMENT" in codes  # refusals on the stream
    assert "OK (update accepted)" not in codes
    assert summary["rss_grown_mib"] < 64
    assert summary["rejections_recorded_for_evil"] >= 1


def test_the_fuzzer_notices_an_unmapped_exception(monkeypatch):
    """The property is not vacuous: a handler bug (UNKNOWN status) fails the run."""
    from benchmarks.fuzz_grpc import allowed

    assert not allowed("PushUpdate", "UNKNOWN") and not allowed("Join", "UNKNOWN") and not allowed("PushUpdate", "OK")
    assert allowed("PushUpdate", "INVALID_ARGUMENT") and allowed("raw:Join", "INTERNAL")
