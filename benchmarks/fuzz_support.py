"""Property-based fuzzing helpers (hypothesis): run budgets, malformed input, the error-type property.

For tests of any parser that takes outside input (trace files today; configs and the gRPC
surface next): strategies that break valid input the ways files and messages really break
(truncated, bit-flipped, binary garbage, wrong JSON types, NaN, huge numbers), and
`raises_only`, the property every such parser must have: it returns, or raises the one
error type it documents, never anything else.

Budget: each test states a small `max_examples` so `make test` stays within seconds and
is deterministic (derandomized: the same examples every run, whatever ran before it in the
process: see `draws_from_seed_alone`). A longer, randomized run:

    make fuzz FUZZ_EXAMPLES=20000     # FLEXFL_FUZZ_EXAMPLES=20000 pytest -m fuzz

A failure prints the smallest failing input and a `@reproduce_failure` line to replay it.
Needs the dev extra (`pip install -e '.[dev]'`); only the tests and benchmarks' fuzzers import this.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

try:
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - only without the dev extra
    raise ImportError("benchmarks.fuzz_support needs hypothesis: pip install -e '.[dev]'") from exc

EXAMPLES_ENV = "FLEXFL_FUZZ_EXAMPLES"


def fuzz_settings(max_examples: int) -> settings:
    """Settings for one fuzz test: `max_examples` derandomized, or FLEXFL_FUZZ_EXAMPLES randomized."""
    raw = os.environ.get(EXAMPLES_ENV, "").strip()
    long_run = bool(raw)
    if long_run:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{EXAMPLES_ENV} must be a positive integer, got {raw!r}")
        max_examples = int(raw)
    return settings(
        max_examples=max_examples,
        derandomize=not long_run,  # CI sees the same examples every run; long runs explore
        database=None,  # no .hypothesis/ folder in the checkout; failures print their input
        deadline=None,  # a busy 2-core machine makes per-example timings meaningless
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


@contextmanager
def draws_from_seed_alone() -> Iterator[None]:
    """Within it, a seeded or derandomized hypothesis run draws the same examples whatever the process imported.

    Hypothesis (6.13x on) also draws constants it reads from the source of every local module
    in sys.modules, so one seed gave other examples after other tests had imported other
    modules: after tests/unit, the gRPC fuzzer's seed 0 sent no Session stream that could be
    refused INVALID_ARGUMENT. Within this block that pool is empty. Hypothesis has no setting
    for it, so this replaces a private function (a no-op where it is missing);
    tests/unit/flexfl/test_fuzz.py fails if a hypothesis release makes the replacement miss.
    """
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # pragma: no cover - a hypothesis without the pool
        yield
        return
    real = getattr(providers, "_get_local_constants", None)
    cache_ = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if real is None or cache_ is None:  # pragma: no cover - moved or gone (the test tells which)
        yield
        return
    providers._get_local_constants = Constants  # an empty pool
    cache_.clear()  # constants already picked from the pool per draw kind
    try:
        yield
    finally:
        providers._get_local_constants = real
        cache_.clear()


# ---- JSON-shaped values: what a hand-edited or corrupted file can hold ---------------------

HUGE_INTS = (2**63, -(2**63) - 1, 2**64, 10**30, 10**400, -(10**400))


@cache  # built once: building and validating strategies costs more than drawing
def json_scalars(*, finite: bool = False) -> st.SearchStrategy[Any]:
    """Any JSON scalar Python's json module reads: null, booleans, any int, floats (NaN/inf
    unless `finite`: json.loads accepts NaN and Infinity), strings."""
    return st.one_of(
        st.none(), st.booleans(),
        st.integers(), st.sampled_from(HUGE_INTS),
        st.floats(allow_nan=not finite, allow_infinity=not finite),
        st.text(max_size=20),
    )


@cache
def json_values(*, finite: bool = False, max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Nested JSON values (arrays and objects of scalars)."""
    return st.recursive(
        json_scalars(finite=finite),
        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                st.dictionaries(st.text(max_size=8), inner, max_size=4)),
        max_leaves=max_leaves,
    )


# Values that break validators most often; drawn often, not left to chance.
EDGE_VALUES: tuple[object, ...] = (
    None, True, False, 0, -1, 1, *HUGE_INTS, 0.5, -0.0, math.nan, math.inf, -math.inf, 1e308, 5e-324,
    "", " ", "0", "1", "nan", "\x00", [], {}, [None], {"": None})


@cache
def edge_json_values() -> st.SearchStrategy[Any]:
    """A JSON value, often one of EDGE_VALUES (wrong type, NaN, infinity, huge, empty)."""
    return st.one_of(st.sampled_from(EDGE_VALUES), json_values())


def deeply_nested_json(depth: int = 100_000) -> str:
    """JSON text of arrays nested `depth` deep (valid JSON that recursive decoders cannot take)."""
    return "[" * depth + "]" * depth


@cache
def number_texts() -> st.SearchStrategy[str]:
    """Cell texts a number column meets: valid, huge, non-finite, malformed, empty."""
    return st.one_of(
        st.integers().map(str), st.sampled_from(HUGE_INTS).map(str),
        st.floats().map(repr),
        st.sampled_from(["", " ", "nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999", "1e-999", "0x10",
                         "1_000", "1,5", "--1", "+", ".", "1.2.3", "0.5.", "١", "\x00", "true", "null", "'1'",
                         "9" * 400, "0." + "9" * 400]),
        st.text(max_size=12),
    )


# ---- corrupting valid bytes ----------------------------------------------------------------


@st.composite
def corrupted(draw: st.DrawFn, valid: bytes) -> bytes:
    """`valid` broken one way a file really breaks (or several ways at once)."""
    data = valid
    for _ in range(draw(st.integers(1, 3))):
        data = draw(st.one_of(
            _truncated(data), _flipped(data), _inserted(data), _deleted(data), _lines_shuffled(data),
            st.binary(max_size=256),  # not this file at all
            st.just(b"\xef\xbb\xbf" + data),  # a byte-order mark from an editor
            st.just(data.replace(b"\n", b"\r\n")),
        ))
    return data


def _truncated(data: bytes) -> st.SearchStrategy[bytes]:
    return st.integers(0, max(0, len(data) - 1)).map(lambda n: data[:n])


def _flipped(data: bytes) -> st.SearchStrategy[bytes]:
    if not data:
        return st.just(data)
    return st.tuples(st.integers(0, len(data) - 1), st.integers(1, 255)).map(
        lambda t: data[:t[0]] + bytes([data[t[0]] ^ t[1]]) + data[t[0] + 1:])


def _inserted(data: bytes) -> st.SearchStrategy[bytes]:
    junk = st.one_of(st.binary(min_size=1, max_size=16),
                     st.sampled_from([b"\x00", b",", b"\n", b'"', b"\xff", b"\n\n"]))
    return st.tuples(st.integers(0, len(data)), junk).map(lambda t: data[:t[0]] + t[1] + data[t[0]:])


def _deleted(data: bytes) -> st.SearchStrategy[bytes]:
    if not data:
        return st.just(data)
    return st.tuples(st.integers(0, len(data) - 1), st.integers(1, 32)).map(
        lambda t: data[:t[0]] + data[t[0] + t[1]:])


def _lines_shuffled(data: bytes) -> st.SearchStrategy[bytes]:
    lines = data.split(b"\n")
    return st.one_of(
        st.permutations(lines).map(b"\n".join),
        st.integers(0, len(lines) - 1).map(lambda i: b"\n".join(lines[:i + 1] + lines[i:])),  # a duplicated line
    )


# ---- the property --------------------------------------------------------------------------


def raises_only(call: Callable[[], Any], allowed: type[BaseException] | tuple[type[BaseException], ...],
                *, message: str | re.Pattern[str] | None = None) -> BaseException | None:
    """Run `call`; return None if it returns, the exception if it raises an `allowed` type whose
    text matches `message` (a regex searched in str(exc)); any other exception fails the test."""
    try:
        call()
    except allowed as exc:
        if message is not None and not re.search(message, str(exc)):
            raise AssertionError(f"{type(exc).__name__} message does not match {message!r}: {exc}") from exc
        return exc
    except Exception as exc:  # the point: anything else is a bug in the parser
        names = ", ".join(t.__name__ for t in (allowed if isinstance(allowed, tuple) else (allowed,)))
        raise AssertionError(f"raised {type(exc).__name__} ({exc}) instead of {names}") from exc
    return None
