"""Trace files: format (read, write, validate), the paper-calibrated generator, the recorder."""

from pathlib import Path

# The paper's recording protocol (trace_recorder.profiles reads it). Here, not in profiles,
# so that `flexfl traces --help` can name it without importing torch.
DEFAULT_PROFILE = Path(__file__).resolve().parent / "paper_profile.toml"
