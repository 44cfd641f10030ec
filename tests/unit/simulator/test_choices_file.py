"""The protocols' choices files: one reader with an error naming the file, one merging writer."""

from __future__ import annotations

import pytest

from flexfl.errors import ConfigError
from simulator.paper.choices_file import read_choices, write_choice


def test_a_missing_file_has_no_choices_and_a_corrupt_one_is_named(tmp_path) -> None:
    assert read_choices(tmp_path / "none.toml") == {}
    bad = tmp_path / "bad.toml"
    bad.write_text("[mnist\neta0 = ")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML"):
        read_choices(bad)


def test_a_choice_joins_the_others_of_its_base_and_replaces_its_own(tmp_path) -> None:
    base, out = tmp_path / "committed.toml", tmp_path / "local" / "choices.toml"
    write_choice(base, ("mnist", "step"), {"eta0": 0.1})
    write_choice(base, ("synthetic", "epoch"), {"eta0": 1.0})
    chosen = write_choice(out, ("mnist", "step"), {"eta0": 0.632}, base=base)
    assert chosen == {"mnist": {"step": {"eta0": 0.632}}, "synthetic": {"epoch": {"eta0": 1.0}}}
    assert read_choices(out) == chosen
    assert read_choices(base)["mnist"]["step"] == {"eta0": 0.1}  # the base is left as it was
