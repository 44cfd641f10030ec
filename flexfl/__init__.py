"""FlexFL: a testbed for federated learning with flexible device participation.

This package holds what every other one uses (config, errors, files, net, signals) and, on
top, the `flexfl` command with the live runner, the process harness and the reports."""

__version__ = "0.1.0"
