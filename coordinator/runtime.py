"""A coordinator process in one object: data, round engine, gRPC server, and their lifecycle."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import traceback
from concurrent import futures
from pathlib import Path
from typing import Any

from coordinator.agent_logs import AgentLogs
from coordinator.config import CoordinatorConfig
from coordinator.engine import RoundEngine
from coordinator.listen import preflight
from coordinator.server import start_server
from flexfl.errors import FlexFLError
from workloads.federated import load_evaluation

log = logging.getLogger(__name__)

# Threads for the uploads' checksums, checks and summing (they release the GIL): about the cores.
UPLOAD_THREADS = 4
# The longest a finished run waits for its devices' last log lines (only devices that sent some before: agents from
# before SendLog or with send_log = false are not waited for; one that died is, for this long).
FINAL_LOG_WAIT_S = 2.0


class Coordinator:
    """Start with start(), wait with wait(); stop() ends training after a final checkpoint."""

    def __init__(self, cfg: CoordinatorConfig, *, resume: bool = False, fresh: bool = False,
                 allow_rule_change: bool = False) -> None:
        self.token = preflight(cfg)  # a missing token or a taken port fails now, not after loading the data
        self.cfg = cfg
        # Sample counts, test set and holdouts only: the training images stay with the devices.
        self.engine = RoundEngine(cfg, data=load_evaluation(cfg.partition), resume=resume, fresh=fresh,
                                  allow_rule_change=allow_rule_change)
        self.agent_logs = AgentLogs.of(cfg)
        self.server = None
        self.port = 0
        self._thread: threading.Thread | None = None
        self.error: FlexFLError | None = None  # what stopped the round engine, if it failed

    def start(self) -> int:
        # torch, the data and the model leave ~175k long-lived objects that every full garbage
        # collection would walk again (~0.1-0.2 s holding the GIL, stalling every transfer):
        # set them aside, as long-running servers do; objects made from here on are collected as usual.
        gc.freeze()
        # The gRPC server runs on its own event loop thread; the round engine on another.
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_drop_grpc_poller_shutdown_error)
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="grpc-server", daemon=True)
        self._loop_thread.start()
        self._work = futures.ThreadPoolExecutor(max_workers=UPLOAD_THREADS, thread_name_prefix="upload")
        try:
            self.server, self.port = asyncio.run_coroutine_threadsafe(
                start_server(self.cfg, self.engine, token=self.token, work=self._work, agent_logs=self.agent_logs),
                self._loop).result()
        except BaseException:
            self._close_loop()
            self.engine.folder.release()  # the engine never runs: give its folder back now
            raise
        self._thread = threading.Thread(target=self._run_engine, name="round-engine", daemon=True)
        self._thread.start()
        return self.port

    def _run_engine(self) -> None:
        try:
            self.engine.run()
        except FlexFLError as exc:  # e.g. a plug-in model that raised: wait() raises it, the CLI says it in one line
            log.error("the round engine stopped: %s", exc)
            self.error = exc

    def stop(self) -> None:
        self.engine.stop()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until training ends (or `timeout`); then shut the server down. True if it ended.

        Raises the FlexFLError that stopped the round engine, once the server is down."""
        assert self._thread is not None, "start() first"
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        # Let agents see FINISHED, and send the last lines of their logs, before the server goes away.
        if self.server is not None:
            self._await_final_logs()
            asyncio.run_coroutine_threadsafe(self.server.stop(grace=1.0), self._loop).result()
            self.server = None
            self._close_loop()
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return True

    def _await_final_logs(self) -> None:
        """Wait (at most FINAL_LOG_WAIT_S) until every device that sends its log, and has not left, has sent it after
        the run ended: an agent sends its last lines once it has seen FINISHED (edge_agent/log_shipping.py)."""
        ended = time.monotonic()
        senders = self.agent_logs.sent_since(0.0)  # an agent that sends its log sends it first after joining
        waiting = {d.device_id for d in self.engine.status().devices if not d.departed} & senders
        while waiting - self.agent_logs.sent_since(ended) and time.monotonic() < ended + FINAL_LOG_WAIT_S:
            time.sleep(0.05)

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join()
        self._loop.close()
        self._work.shutdown(wait=True)

    @property
    def out_dir(self) -> Path:
        return self.engine.out_dir


def _drop_grpc_poller_shutdown_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Loop exception handler: a known gRPC aio shutdown race is logged at debug, the rest as usual.

    Stopping the server closes its completion queue's socket while the loop may still run a
    queued read of it: OSError EBADF (or EAGAIN) in PollerCompletionQueue._handle_events,
    printed as a traceback although nothing is lost (grpc/grpc#34139).
    """
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.__traceback__ is not None:
        frames = traceback.extract_tb(exc.__traceback__)
        if frames and frames[-1].name.endswith("PollerCompletionQueue._handle_events"):
            log.debug("gRPC's poller read a closed socket while the server stopped (grpc/grpc#34139): %s", exc)
            return
    loop.default_exception_handler(context)
