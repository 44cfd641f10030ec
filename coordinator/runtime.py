"""A coordinator process in one object: data, round engine, gRPC server, and their lifecycle."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.engine import RoundEngine
from coordinator.server import build_server, preflight
from workloads.federated import build_federated

log = logging.getLogger(__name__)


class Coordinator:
    """Start with start(), wait with wait(); stop() ends training after a final checkpoint."""

    def __init__(self, cfg: CoordinatorConfig, *, resume: bool = False) -> None:
        self.token = preflight(cfg)  # a missing token or a taken port fails now, not after loading the data
        self.cfg = cfg
        self.engine = RoundEngine(cfg, data=build_federated(cfg.partition), resume=resume)
        self.server = None
        self.port = 0
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        self.server, self.port = build_server(self.cfg, self.engine, token=self.token)
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
