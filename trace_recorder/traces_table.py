"""[traces] of a run's config: which trace set devices follow, and how many of its traces (docs/config.md).

Shared by `flexfl sim run` and `flexfl live` files (and a campaign's base) with the same keys; here, beside
the trace sets it names, so that the ground (flexfl/run_spec.py, [run]) needs no trace package.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexfl.config import path_field
from flexfl.errors import ConfigError
from trace_recorder import PAPER_TRACE_SET


@dataclass(frozen=True)
class TracesConfig:
    """[traces]: devices follow traces drawn from the first `num_traces` (|T|) of the trace set `set`.

    The assignment and the draws are trace_recorder.sampler's, live and simulated alike. `flexfl live`
    reads set = "" as "agents follow no trace" (deadline mode)."""

    set: str = path_field(str(PAPER_TRACE_SET))
    num_traces: int = 8

    def __post_init__(self) -> None:
        if self.num_traces < 1:
            raise ConfigError(f"traces.num_traces must be >= 1, got {self.num_traces}")
