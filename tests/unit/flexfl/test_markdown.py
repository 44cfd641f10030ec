"""The results pages' Markdown helper: tables, sections that vanish when empty, one rounding rule."""

from __future__ import annotations

import pytest

from flexfl.markdown import fixed, join, ranges, section, table


def test_table_has_a_header_rule_and_one_line_per_row() -> None:
    assert table(["a", "b"], [[1, "x"], [2.5, "y"]]) == "| a | b |\n|---|---|\n| 1 | x |\n| 2.5 | y |\n"
    assert table(["", "b"], [["mean", ""]]) == "| | b |\n|---|---|\n| mean | |\n"


def test_an_empty_section_is_left_out() -> None:
    assert section("Every reading", "\n") == ""
    assert section("Every reading", "text\n", level=3) == "### Every reading\n\ntext\n"
    assert join("a\n", "", "b\n") == "a\n\nb\n"


@pytest.mark.parametrize(("value", "digits", "text"), [
    # The committed MNIST final losses (results/epoch-paper/table3_runs.csv): rounded once, not by
    # way of 1.805 / 3.775 / 3.795 as results/README.md had them (1.81, 3.78, 3.80).
    (1.804714599609375, 2, "1.80"), (3.77453798828125, 2, "3.77"), (3.794763818359375, 2, "3.79"),
    # A CSV value that is exactly half way rounds to even, as written (not as its binary neighbour).
    (2.675, 2, "2.68"), (2.665, 2, "2.66"), (0.125, 2, "0.12"), (40.0, 1, "40.0"), (-0.04, 1, "-0.0"),
])
def test_fixed_rounds_once_half_to_even_from_the_written_value(value: float, digits: int, text: str) -> None:
    assert fixed(value, digits) == text


def test_fixed_scales_the_written_value_not_its_binary_product() -> None:
    # 0.9145 * 100 is 91.45000000000002 in binary ("91.5" by f-format); as written it is 91.45.
    assert (fixed(0.9145, 1, scale=100), fixed(0.9155, 1, scale=100), fixed(0.5, 1, scale=100)) == \
        ("91.4", "91.6", "50.0")


def test_fixed_passes_non_finite_values_through() -> None:
    assert (fixed(float("nan"), 2), fixed(float("inf"), 1)) == ("nan", "inf")


def test_ranges() -> None:
    assert (ranges([96, 28, 45]), ranges([7, 7]), ranges([])) == ("28-96", "7", "")
