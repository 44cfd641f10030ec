"""Workloads: models, datasets (MNIST, EMNIST, SYNTHETIC) and partitioners."""
