"""Coordinator: aggregation rules (schemes A/B/C), participation policies, and (later) the gRPC round engine."""
