"""Coordinator: the gRPC server and its round engine (device registry, deadlines, membership), the
round step the simulator shares (round.py), aggregation schemes A/B/C and other strategies,
participation policies (fast-reboot, departures), checkpoints and metrics files."""
