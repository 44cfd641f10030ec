"""Benchmarks: scripts that print measured figures (speed, memory), run with `python -m benchmarks.NAME`."""
