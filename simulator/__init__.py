"""Simulator: replays participation traces over simulated devices; paper experiments."""
