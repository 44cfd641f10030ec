"""Open a report in headless Chromium: console errors, broken images, outside requests, a screenshot.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: it reads
NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4), so nothing but
the Chromium binary is needed: no websocket client, no driver download. The browser runs
with a fresh profile and with networking that is not the page's own switched off; any
request the page makes other than its own file and data: URIs is reported, which is how a
report that is not self-contained shows up.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexfl.errors import FlexFLError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-default-browser-check", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe")
# Every image decoded, then the ones that did not load (none is the goal).
_IMAGES_JS = """(async () => {
  const imgs = [...document.images];
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  return {count: imgs.length,
          broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt || i.src.slice(0, 80))};
})()"""


class BrowserError(FlexFLError):
    """Chromium could not be started or did not answer."""


@dataclass
class PageCheck:
    url: str
    images: int = 0
    broken_images: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)  # console.error, exceptions, error log entries
    warnings: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)  # anything but the page itself and data: URIs
    height_px: int = 0
    off_right: list[str] = field(default_factory=list)  # elements past the window's right edge (not in a .scroll box)

    @property
    def ok(self) -> bool:
        return not (self.broken_images or self.console_errors or self.outside_requests) and self.images > 0


def find_chromium() -> str | None:
    """Path of a Chromium binary on PATH, or None."""
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


class _Chromium:
    """One headless Chromium with a pipe to its DevTools endpoint; always killed on close()."""

    def __init__(self, binary: str, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="flexfl-chromium-")
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # Move the child's ends above fd 10 so the dup2 to 3 and 4 cannot clobber each other.
        child_in = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        log = os.open(Path(self.profile) / "chromium.log", os.O_WRONLY | os.O_CREAT, 0o644)
        argv = [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        try:
            self.pid = os.posix_spawn(binary, argv, os.environ, file_actions=[
                (os.POSIX_SPAWN_DUP2, child_in, 3), (os.POSIX_SPAWN_DUP2, child_out, 4),
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2)], setpgroup=0)
        finally:
            for fd in (child_in, child_out, log):
                os.close(fd)
        self.write_fd, self.read_fd = to_chrome_w, from_chrome_r
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, *, session: str | None = None) -> dict:
        """Send one command and wait for its reply; events that arrive meanwhile are kept."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"chromium: {method} failed: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, *, session: str) -> dict:
        for i, e in enumerate(self.events):
            if e.get("method") == method and e.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            e = self._read()
            if e.get("method") == method and e.get("sessionId") == session:
                return e
            self.events.append(e)

    def _read(self) -> dict:
        limit = time.monotonic() + self.timeout_s
        while b"\0" not in self._buffer:
            left = limit - time.monotonic()
            ready, _, _ = select.select([self.read_fd], [], [], max(0.0, left))
            if not ready:
                raise BrowserError(f"chromium did not answer within {self.timeout_s:g} s "
                                   f"(its log: {Path(self.profile) / 'chromium.log'})")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium closed its DevTools pipe; its log: {self._log_tail()}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _log_tail(self) -> str:
        try:
            return (Path(self.profile) / "chromium.log").read_text(errors="replace")[-600:]
        except OSError:
            return "(none)"

    def close(self) -> None:
        try:
            os.write(self.write_fd, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except OSError:
            pass
        for fd in (self.write_fd, self.read_fd):
            os.close(fd)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if os.waitpid(self.pid, os.WNOHANG) != (0, 0):
                break
            time.sleep(0.05)
        else:
            os.killpg(self.pid, signal.SIGKILL)  # its own process group: renderers and helpers too
            os.waitpid(self.pid, 0)
        try:  # helpers that outlive the browser process (its group id is the browser's pid)
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(self.profile, ignore_errors=True)


def check_page(html: Path, *, screenshot: Path | None = None, width_px: int = 1280, binary: str | None = None,
               timeout_s: float = 60.0) -> PageCheck:
    """Load `html` in headless Chromium; report console errors, broken images and outside requests,
    and save a full-page PNG to `screenshot`."""
    binary = binary or find_chromium()
    if binary is None:
        raise BrowserError(f"no Chromium found (looked for {', '.join(CHROMIUM_NAMES)}); "
                           "on Debian: apt-get install chromium")
    url = Path(html).resolve().as_uri()
    result = PageCheck(url=url)
    browser = _Chromium(binary, timeout_s=timeout_s)
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable", session=session)
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": width_px, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.call("Page.navigate", {"url": url}, session=session)
        browser.wait_event("Page.loadEventFired", session=session)
        images = browser.call("Runtime.evaluate", {"expression": _IMAGES_JS, "awaitPromise": True,
                                                   "returnByValue": True}, session=session)["result"]["value"]
        result.images, result.broken_images = images["count"], images["broken"]
        result.off_right = browser.call("Runtime.evaluate", {"expression": _OFF_RIGHT_JS, "returnByValue": True},
                                        session=session)["result"]["value"]
        size = browser.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        result.height_px = int(size["height"])
        if screenshot is not None:
            shot = browser.call("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width_px, "height": result.height_px, "scale": 1}}, session=session)
            Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
            Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        _collect(browser.events, result)
    finally:
        browser.close()
    return result


# What runs past the right edge of the window: the reader would have to scroll sideways to see it
# (tables in a .scroll box scroll on purpose). Each as "tag: its first words".
_OFF_RIGHT_JS = """(() => {
  const width = document.documentElement.clientWidth, out = [];
  for (const el of document.querySelectorAll("nav a, h1, h2, h3, p, figure, table")) {
    if (el.closest(".scroll")) continue;
    const box = el.getBoundingClientRect();  // a block's box keeps its width; its overflowing text does not
    if (Math.max(box.right, box.left + el.scrollWidth) > width + 0.5)
      out.push(el.tagName.toLowerCase() + ": " + el.textContent.trim().slice(0, 40).trim());
  }
  return out;
})()"""


def _collect(events: list[dict], result: PageCheck) -> None:
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            if p.get("type") in ("error", "assert"):
                result.console_errors.append(f"console.{p['type']}: {text}")
            elif p.get("type") == "warning":
                result.warnings.append(f"console.warning: {text}")
        elif method == "Runtime.exceptionThrown":
            details = p.get("exceptionDetails", {})
            what = details.get("exception", {}).get("description") or details.get("text")
            result.console_errors.append(f"exception: {what}")
        elif method == "Log.entryAdded":
            entry = p.get("entry", {})
            line = f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip()
            if entry.get("level") == "error":
                result.console_errors.append(line)
            elif entry.get("level") == "warning":
                result.warnings.append(line)
        elif method == "Network.requestWillBeSent":
            req_url = p.get("request", {}).get("url", "")
            if req_url != result.url and not req_url.startswith("data:"):
                result.outside_requests.append(req_url)
        elif method == "Network.loadingFailed":
            result.console_errors.append(f"network: {p.get('errorText')} ({p.get('type')})")
