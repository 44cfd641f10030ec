"""Workloads: models, datasets (MNIST, EMNIST, SYNTHETIC), how they are split over devices (the
partition spec every config embeds, and the partitioners) and evaluation."""
