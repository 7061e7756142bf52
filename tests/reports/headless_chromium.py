"""Headless Chromium driven over the DevTools protocol: load a page, collect errors, screenshot.

Debian's ``/usr/bin/chromium`` is started with a fresh profile and no
network services (the test machines have no network). The page is loaded
through ``Page.navigate``; console messages of level error
(``Runtime.consoleAPICalled``), uncaught exceptions
(``Runtime.exceptionThrown``) and browser log entries of level error
(``Log.entryAdded``: failed loads, blocked resources, CSP violations) are
collected until the load event, then ``Page.captureScreenshot`` writes a PNG.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-port=0",
    "--window-size=1200,1600",
)
TIMEOUT = 60.0


def load_page(page: Path, screenshot: Path) -> list[str]:
    """Load ``page`` in headless Chromium, write a screenshot; return every error it logged."""
    # Chromium's helper processes may still write to the profile for a moment after the
    # browser exits: the whole process group is stopped, and a straggling file does not fail
    # the cleanup of this throwaway profile.
    with tempfile.TemporaryDirectory(
        prefix="chromium-profile-", ignore_cleanup_errors=True
    ) as profile:
        process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            port = _devtools_port(process)
            return _drive(port, page.resolve().as_uri(), screenshot)
        finally:
            _stop_group(process)


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to Chromium's process group, SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _devtools_port(process: subprocess.Popen) -> int:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            raise RuntimeError(f"chromium exited with code {process.returncode}")
        found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if found:
            return int(found.group(1))
    raise RuntimeError("chromium did not open its DevTools port")


def _page_socket(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
        targets = json.load(response)
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


def _drive(port: int, url: str, screenshot: Path) -> list[str]:
    errors: list[str] = []
    with connect(_page_socket(port), max_size=None, open_timeout=TIMEOUT) as socket:
        ids = iter(range(1, 1_000_000))

        def call(method: str, **params: object) -> dict:
            number = next(ids)
            socket.send(json.dumps({"id": number, "method": method, "params": params}))
            while True:
                message = json.loads(socket.recv(timeout=TIMEOUT))
                if message.get("id") == number:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    return message["result"]
                _collect(message, errors)

        for domain in ("Page", "Runtime", "Log"):
            call(f"{domain}.enable")
        call("Page.navigate", url=url)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            message = json.loads(socket.recv(timeout=TIMEOUT))
            _collect(message, errors)
            if message.get("method") == "Page.loadEventFired":
                break
        else:
            raise RuntimeError(f"{url} did not finish loading")
        call("Runtime.evaluate", expression="1")  # let late console events arrive first
        shot = call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    return errors


def _collect(message: dict, errors: list[str]) -> None:
    method, params = message.get("method"), message.get("params", {})
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        errors.append("console: " + " ".join(str(a.get("value")) for a in params.get("args", [])))
    elif method == "Runtime.exceptionThrown":
        errors.append("exception: " + params["exceptionDetails"].get("text", ""))
    elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
        entry = params["entry"]
        errors.append(f"log: {entry.get('text', '')} {entry.get('url', '')}".strip())
