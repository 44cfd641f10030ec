"""Trace files: format (read, write, validate), the paper-calibrated generator, the recorder."""
