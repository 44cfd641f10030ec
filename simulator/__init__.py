"""Simulator: replays participation traces over simulated devices through the round step the
coordinator runs; fast trainers, resumable sweeps (local or Ray), and the paper's tables and figures."""
