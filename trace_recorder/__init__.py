"""Traces: the format (read, write, validate), the sampler that draws a device's s from its trace
(shared by the agent and the simulator), the paper-calibrated generator, and the recorder with its
profiles."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent

# The paper's recording protocol (trace_recorder.recording.profiles reads it). Here, not in profiles,
# so that `flexfl traces --help` can name it without importing torch.
DEFAULT_PROFILE = _HERE / "paper_profile.toml"

# The trace sets FlexFL ships: traces/ of the repository (a checkout, an editable install), or
# the same folder installed as package data of this package (a wheel: pyproject.toml maps
# trace_recorder.traces to traces/), where a `pip install .` puts nothing beside site-packages.
TRACE_SETS_DIR = _HERE / "traces" if (_HERE / "traces").is_dir() else _HERE.parent / "traces"
PAPER_TRACE_SET = TRACE_SETS_DIR / "paper"
