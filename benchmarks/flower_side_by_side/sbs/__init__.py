"""The side-by-side's Flower app (benchmarks/flower_side_by_side.py)."""
