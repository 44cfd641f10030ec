"""The paper's published numbers that the simulator's experiments are compared against."""

from __future__ import annotations

from typing import Any

from workloads.partition_spec import Dataset, PartitionSpec

# The datasets FlexFL's paper sweeps (Tables 3-5, Figure 6, the operating point) run on; the paper's
# EMNIST rows need a local copy of EMNIST (no download), so no sweep offers them.
SWEEP_DATASETS: tuple[Dataset, ...] = (Dataset.SYNTHETIC, Dataset.MNIST)

# Table 3 ("tab:exp_schemes"): % improvement of test accuracy, (B over A, C over B), |T| = 1..8.
PAPER_TABLE3: dict[tuple[str, str], list[tuple[float, float]]] = {
    ("mnist", "iid"): [(-0.6, 0.3), (1.9, 0.1), (5.6, 0.1), (8.3, 0.7), (10.4, 2.6), (14.0, 2.2),
                       (5.8, 1.9), (11.8, 2.4)],
    ("mnist", "niid"): [(0.2, -0.3), (9.5, 1.8), (19.3, 1.6), (33.8, 3.3), (33.2, 3.2), (28.7, 6.2), (36.0, 3.6),
                        (43.4, 6.9)],
    ("emnist", "iid"): [(0.7, -0.6), (0.9, 0.1), (4.2, 0.7), (4.8, 1.0), (6.9, 1.1), (6.6, 1.2),
                        (4.0, 1.5), (7.6, 1.2)],
    ("emnist", "niid"): [(-0.1, -0.7), (17.0, -2.0), (34.2, 1.8), (37.9, 4.8), (30.2, 2.5), (22.5, 3.0), (25.3, 2.2),
                         (18.6, 1.8)],
    ("synthetic", "iid"): [(-0.6, 0.5), (2.1, 0.1), (6.6, 0.0), (9.0, 0.7), (11.6, 3.0), (16.4, 2.5), (6.3, 1.9),
                           (14.4, 2.8)],
    ("synthetic", "niid"): [(0.1, -0.4), (9.6, 1.5), (22.2, 1.8), (38.2, 3.2), (33.3, 3.9), (30.5, 7.9), (37.9, 4.5),
                            (41.6, 8.0)],
}

# Section 5.1: devices per dataset in the scheme comparison.
PAPER_DEVICES = {"mnist": 100, "emnist": 62, "synthetic": 50}
# What a simulation splits when its config names no partition (SimConfig; `flexfl sim run --help` states it):
# SYNTHETIC(1,1) non-IID over the paper's 50 devices.
DEFAULT_PARTITION = PartitionSpec(n_devices=PAPER_DEVICES["synthetic"])

# Setting name -> [partition] fields (Section 5.1). Non-IID SYNTHETIC is (alpha, beta) = (1, 1)
# unless --alpha/--beta say otherwise (workloads.partition_spec: the defaults for non-IID);
# IID SYNTHETIC is the shared-model variant, alpha = beta = 0.
SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "synthetic": {"iid": {"iid": True}, "niid": {"iid": False}},
    "mnist": {"iid": {"iid": True}, "niid": {"iid": False}},
    "emnist": {"iid": {"iid": True}, "niid": {"iid": False}},
}
