"""A coordinator process in one object: data, round engine, gRPC server, and their lifecycle."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.rounds import RoundEngine
from coordinator.server import build_server
from workloads.federated import build_federated

log = logging.getLogger(__name__)


class Coordinator:
    """Start with start(), wait with wait(); stop() ends training after a final checkpoint."""

    def __init__(self, cfg: CoordinatorConfig, *, resume: bool = False) -> None:
        t = cfg.training
        data = build_federated(
            t.dataset, n_devices=t.n_devices, iid=t.iid, seed=t.data_seed, alpha=t.alpha, beta=t.beta,
            total_samples=t.total_samples or None, sizes=t.sizes,
        )
        self.cfg = cfg
        self.engine = RoundEngine(cfg, test_data=data.test, device_test=data.device_test, resume=resume)
        self.server = None
        self.port = 0
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        self.server, self.port = build_server(self.cfg, self.engine)
        self._thread = threading.Thread(target=self.engine.run, name="round-engine", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self.engine.stop()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until training ends (or `timeout`); then shut the server down. True if it ended."""
        assert self._thread is not None, "start() first"
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        # Let agents see FINISHED before the server goes away.
        if self.server is not None:
            self.server.stop(grace=1.0).wait()
        return True

    @property
    def out_dir(self) -> Path:
        return self.engine.out_dir
