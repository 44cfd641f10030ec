"""Property-based fuzzing of the config parsers: any file gives a config or a ConfigError, nothing else.

Every config class that FlexFL reads from TOML (flexfl.config.load_config) gets documents
that are random bytes, random text, random TOML values under its real and misspelt keys,
and its own valid config with one value replaced; PartitionSpec also gets random JSON (the
coordinator parses a joining device's partition_json). A parser that raises anything but
ConfigError (TypeError, ValueError, OverflowError, RecursionError, ...) fails the property:
hypothesis then shrinks the document to a minimal one and raises with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import tempfile
import tomllib
import typing
from collections import Counter
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from benchmarks.fuzz_support import draws_from_seed_alone
from coordinator.config import CoordinatorConfig
from edge_agent.config import AgentConfig
from flexfl.app.live import LiveConfig
from flexfl.config import load_config, to_dict
from flexfl.errors import ConfigError
from simulator.engine import SimConfig
from trace_recorder.recording.profiles import DEFAULT_PROFILE, Inventory, Profile
from workloads.partition_spec import PartitionSpec

CLASSES: dict[str, type] = {"coordinator": CoordinatorConfig, "agent": AgentConfig, "live": LiveConfig,
                            "sim": SimConfig, "profile": Profile, "inventory": Inventory, "partition": PartitionSpec}

# TOML values of every kind, including the ones no field accepts (dates, NaN, huge integers).
_SCALARS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.text(max_size=40), st.datetimes(max_value=datetime.datetime(9999, 1, 1)),
    st.dates(), st.times(),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(min_size=1, max_size=12), inner, max_size=4)),
    max_leaves=12)


def _keys(cls: type) -> list[str]:
    """Field names of `cls` and of its nested config tables, as "key" or "table.key"."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.append(f.name)
        tp = hints[f.name]
        tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
        if dataclasses.is_dataclass(tp):
            out += [f"{f.name}.{k}" for k in _keys(tp)]
    return out


def _put(doc: dict, dotted: str, value: Any) -> None:
    *tables, key = dotted.split(".")
    node = doc
    for t in tables:
        nxt = node.get(t)
        if not isinstance(nxt, dict):
            nxt = node[t] = {}
        node = nxt
    node[key] = value


def _valid(cls: type) -> dict:
    """A valid document of `cls` (the paper profile, a one-host inventory, else the defaults)."""
    if cls is Profile:
        return tomllib.loads(DEFAULT_PROFILE.read_text())
    if cls is Inventory:
        return {"coordinator_listen": "10.0.0.1:50051", "fleet_token_file": "/tmp/token", "n_devices": 2,
                "devices": [{"device_id": "pi-01", "trace": "T50", "loadgen": "tcp://10.0.0.2:5601"}]}
    return to_dict(cls())


def _leaves(doc: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in doc.items():
        if isinstance(v, dict):
            out += _leaves(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _like(value: Any) -> st.SearchStrategy:
    """Values of the same TOML type as `value` (the interesting ones: zero, negative, huge, empty)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1))
    if isinstance(value, float):
        return st.one_of(st.sampled_from([0.0, -0.0, -1.0, 1e-300, 1e300]), st.floats(allow_nan=False))
    if isinstance(value, str):
        return st.one_of(st.just(""), st.text(max_size=20), st.sampled_from(["A", "C", "mnist", "iid", "x:y"]))
    if isinstance(value, list):
        return st.lists(st.one_of(st.integers(-3, 10**6), st.text(max_size=5)), max_size=5)
    return _VALUES


@st.composite
def documents(draw, cls: type) -> bytes:
    """One config file's bytes for `cls`."""
    kind = draw(st.sampled_from(["bytes", "text", "keys", "mutated", "typed", "typed"]))
    if kind == "typed":  # right types, wrong values: what __post_init__ validation must catch
        doc = _valid(cls)
        leaves = _leaves(doc)
        if leaves:
            for _ in range(draw(st.integers(1, 3))):
                key, old = draw(st.sampled_from(leaves))
                _put(doc, key, draw(_like(old)))
        return tomli_w.dumps(doc).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "text":
        return draw(st.text(max_size=300)).encode("utf-8", "surrogatepass")
    keys = _keys(cls)
    doc = _valid(cls) if kind == "mutated" else {}
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.one_of(st.sampled_from(keys), st.sampled_from(keys).map(lambda k: k + "z"),
                             st.text(min_size=1, max_size=10)))
        _put(doc, key, draw(_VALUES))
    try:
        return tomli_w.dumps(doc).encode()
    except (TypeError, ValueError):  # a value tomli_w cannot write (e.g. a table key it refuses)
        return json.dumps(doc, default=str).encode()


def check_document(cls: type, raw: bytes, folder: Path) -> str:
    """Load `raw` as a `cls` config: "loaded" or "ConfigError"; any other exception propagates."""
    path = folder / "fuzz.toml"
    path.write_bytes(raw)
    try:
        load_config(cls, path)
        return "loaded"
    except ConfigError:
        return "ConfigError"


def check_partition_json(text: str) -> str:
    try:
        PartitionSpec.from_json(text, where="fuzz")
        return "loaded"
    except ConfigError:
        return "ConfigError"


_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(st.text(max_size=12), inner, max_size=5)), max_leaves=15)


@st.composite
def partition_json(draw) -> str:
    kind = draw(st.sampled_from(["text", "json", "mutated"]))
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "json":
        return json.dumps(draw(_JSON))
    doc = json.loads(PartitionSpec().to_json())
    doc[draw(st.sampled_from(sorted(doc)) | st.text(max_size=8))] = draw(_JSON)
    return json.dumps(doc)


def fuzz_configs(examples: int, *, random_seed: int = 0) -> Counter:
    """Run `examples` documents per parser; returns {(parser, outcome): count}."""
    tally: Counter = Counter()
    cfg = settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                   suppress_health_check=list(HealthCheck))
    # The documents of a seed, not of what the process imported before.
    with tempfile.TemporaryDirectory(prefix="flexfl-fuzz-") as d, draws_from_seed_alone():
        folder = Path(d)
        for name, cls in CLASSES.items():
            @seed(random_seed)
            @cfg
            @given(raw=documents(cls))
            def one(raw: bytes) -> None:
                # called right below, in this iteration: the loop variables are the current ones
                tally[(name, check_document(cls, raw, folder))] += 1  # noqa: B023

            one()

        @seed(random_seed)
        @cfg
        @given(text=partition_json())
        def one_json(text: str) -> None:
            tally[("partition_json", check_partition_json(text))] += 1

        one_json()
    return tally
