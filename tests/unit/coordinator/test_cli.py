"""The coordinator's commands: the [rules] flags (shared with `flexfl sim` and `live`), and `flexfl token`."""

import argparse

import pytest

from coordinator.cli import add_rules_flags
from coordinator.rules.config import RulesConfig
from flexfl.config import overrides_from_args


def _rules(*argv: str) -> RulesConfig:
    p = argparse.ArgumentParser()
    add_rules_flags(p)
    return RulesConfig(**overrides_from_args(p.parse_args(list(argv))).get("rules", {}))


def test_every_departure_policy_and_its_constant_can_be_given_as_flags():
    assert _rules("--departure-policy", "threshold", "--threshold-k", "30") == RulesConfig(
        departure_policy="threshold", threshold_k=30.0)
    assert _rules("--departure-policy", "auto", "--auto-c", "2.5") == RulesConfig(departure_policy="auto", auto_c=2.5)
    assert _rules() == RulesConfig()
    with pytest.raises(SystemExit):
        _rules("--departure-policy", "sometimes")


def test_every_registered_strategy_is_a_choice_of_the_strategy_flag(monkeypatch, capsys):
    from coordinator.rules import strategies
    assert _rules("--strategy", "fednova") == RulesConfig(strategy="fednova")
    assert _rules("--strategy", "fedprox", "--mu", "0.01") == RulesConfig(strategy="fedprox", mu=0.01)
    assert _rules("--strategy", "scheme-b") == _rules("--scheme", "B") == RulesConfig(scheme="B")
    # The choices come from the registry: a strategy registered later is a choice too.
    monkeypatch.setitem(strategies.STRATEGIES, "fedlater", strategies.SchemeStrategy(strategies.Scheme.B))
    p = argparse.ArgumentParser()
    add_rules_flags(p)
    assert p.parse_args(["--strategy", "fedlater"]).__dict__["cfg.rules.strategy"] == "fedlater"
    with pytest.raises(SystemExit):
        _rules("--strategy", "fedavg")
    with pytest.raises(SystemExit):  # one aggregation flag, not two
        _rules("--strategy", "scheme-b", "--scheme", "A")
    assert "{scheme-a,scheme-b,scheme-c,fednova,fedprox,mifa,fedlater}" in capsys.readouterr().err


def test_token_refuses_a_folder_that_does_not_exist_and_writes_into_one_that_does(tmp_path, capsys):
    import stat

    from flexfl.app.cli import main

    missing = tmp_path / "nonexistent" / "dir"
    assert main(["token", "--out", str(missing / "tok")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flexfl: error: --out ") and f"{missing} does not exist" in err, err
    assert not (tmp_path / "nonexistent").exists()  # nothing created on the way
    (tmp_path / "file").write_text("")
    assert main(["token", "--out", str(tmp_path / "file" / "tok")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["token", "--out", str(tmp_path / "tok")]) == 0
    assert len((tmp_path / "tok").read_text().strip()) == 64
    assert stat.S_IMODE((tmp_path / "tok").stat().st_mode) == 0o600
