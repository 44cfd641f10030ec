"""FlexFL: a testbed for federated learning with flexible device participation."""

__version__ = "0.1.0"
