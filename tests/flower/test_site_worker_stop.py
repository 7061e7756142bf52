"""The long-lived site worker stops within ``STOP_WITHIN`` seconds of SIGTERM, exit code 0.

A site's SuperNode and its worker run as two processes (README, deployment
guide step 5; ``fedstats site run`` starts and stops them too). The worker must
stop promptly whatever its SuperNode is doing: still answering (the worker is
polling it), stopped first (the worker is in Flower's HTTP retry, which on its
own retries for ever with waits up to 20 s), or frozen (the worker's poll hangs
until the HTTP client's 30 s timeout). Real processes: a Flower SuperNode
(``python -m fedstats.flower.supernode --isolation process``, no SuperLink
needed for its Runtime API) and ``python -m fedstats.flower_apps.site_worker``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fedstats.flower import processes
from fedstats.flower_apps.site_worker import EXIT_STOPPED, STOP_WITHIN


def start_worker(home: Path, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "fedstats.flower_apps.site_worker"]
    command += ["--runtime-api-address", f"127.0.0.1:{port}"]
    home.mkdir(parents=True, exist_ok=True)
    log = (home / "site-worker.log").open("ab")
    return subprocess.Popen(
        command,
        env=processes.flower_env(home),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for_log(path: Path, text: str, process: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        assert process.poll() is None, f"{process.args} ended: {path.read_text(errors='replace')}"
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in {path} within {timeout} s")


def seconds_to_stop(worker: subprocess.Popen) -> tuple[float, int | None]:
    """SIGTERM the worker; seconds until it exited (or 3 × STOP_WITHIN) and its exit code."""
    started = time.monotonic()
    os.kill(worker.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.wait(timeout=3 * STOP_WITHIN)
    return time.monotonic() - started, worker.poll()


def test_the_site_worker_stops_promptly_on_sigterm(tmp_path: Path) -> None:
    port = processes.free_port()
    nowhere = f"127.0.0.1:{processes.free_port()}"  # no SuperLink: the node keeps retrying it
    node, polling = processes.start_supernode(
        tmp_path / "node", nowhere, port, tmp_path / "site.toml", long_lived=True
    )
    frozen_poll = start_worker(tmp_path / "frozen", port)
    node_gone = start_worker(tmp_path / "gone", port)
    everyone = [node, polling, frozen_poll, node_gone]
    try:
        processes.wait_for_port(port, 90, node)
        for worker, log in [
            (polling, tmp_path / "node" / "site-worker.log"),
            (frozen_poll, tmp_path / "frozen" / "site-worker.log"),
            (node_gone, tmp_path / "gone" / "site-worker.log"),
        ]:
            wait_for_log(log, "for tasks", worker)
        time.sleep(0.5)  # every worker polls the live node (every 10 ms)

        # 1. the SuperNode answers: the worker ends its poll loop
        seconds, code = seconds_to_stop(polling)
        print(f"\nidle worker, live SuperNode: stopped in {seconds:.2f} s, exit {code}")
        assert code == EXIT_STOPPED and seconds <= STOP_WITHIN, (seconds, code)

        # 2. the SuperNode hangs (SIGSTOP): the worker's poll waits for a reply that does not
        #    come; SIGTERM abandons it
        os.killpg(node.pid, signal.SIGSTOP)
        time.sleep(1.0)
        seconds, code = seconds_to_stop(frozen_poll)
        os.killpg(node.pid, signal.SIGCONT)
        print(f"worker polling a frozen SuperNode: stopped in {seconds:.2f} s, exit {code}")
        assert code == EXIT_STOPPED and seconds <= STOP_WITHIN, (seconds, code)

        # 3. the SuperNode was stopped first, as a site stops it (SIGTERM, SIGKILL after
        #    processes.STOP_GRACE: within STOP_WITHIN too): the worker is in Flower's HTTP
        #    retry backoff
        started = time.monotonic()
        processes.stop([node])
        node_seconds = time.monotonic() - started
        print(f"SuperNode: stopped in {node_seconds:.2f} s, exit {node.returncode}")
        assert node.returncode is not None and node_seconds <= STOP_WITHIN, node_seconds
        wait_for_log(tmp_path / "gone" / "site-worker.log", "Connection attempt failed", node_gone)
        time.sleep(1.0)
        seconds, code = seconds_to_stop(node_gone)
        print(f"worker whose SuperNode stopped first: stopped in {seconds:.2f} s, exit {code}")
        assert code == EXIT_STOPPED and seconds <= STOP_WITHIN, (seconds, code)
        assert "stopped on request" in (tmp_path / "gone" / "site-worker.log").read_text()
    finally:
        for process in everyone:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)
        processes.stop(everyone)
