"""Serving one batch run's worth of the study's requests over Flower, then stopping.

:func:`serve_over_flower` first checks that the study's SuperLink accepts a
TCP connection within ``[coordinator] connect_timeout`` (else
:class:`CoordinatorUnreachable`), then starts the site's SuperNode with its
long-lived site worker (:func:`fedstats.flower.processes.start_supernode`:
two processes, TLS root certificates and the node's authentication key when
configured, their logs and ``FLWR_HOME`` under ``workdir/flower``), and
watches until one of these ends the run:

* **idle** — the site answered at least one request in this run and no new
  line has reached its journal for ``[coordinator] idle_timeout`` seconds,
  with no request still open. The journal is the site's own durable record of
  every request (``received`` before the silo runs, ``answered`` before the
  reply leaves; :mod:`fedstats.jobs.site_journal`), so it tells the job, without
  trusting anything the coordinator says, when the coordinator stopped
  asking. A coordinator's run sends its next request right after the last
  reply, so a quiet journal means its run is over with this site. (Flower
  gives a SuperNode no "run finished" signal, and the site worker serves
  every run, so neither process exits by itself.)
* **serve_timeout** — ``[coordinator] serve_timeout`` seconds passed since
  serving started (requests were answered, but the coordinator kept asking);
* **no request** — ``serve_timeout`` passed without any request;
* a process ended by itself (bad certificate, rejected node key, crash):
  :class:`SiteProcessesFailed` with the end of its log.

Every process started is stopped before the function returns (SIGTERM, then
SIGKILL after a grace period, each with its process group), however it returns.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedstats.errors import CoordinatorUnreachable, SiteProcessesFailed
from fedstats.jobs.events import emit
from fedstats.jobs.site_config import CoordinatorSection, SiteConfig
from fedstats.jobs.site_journal import SiteJournal

_log = logging.getLogger(__name__)
WATCH_INTERVAL = 0.2
"""Seconds between looks at the journal and the processes."""


@dataclass
class ServeResult:
    """How serving ended, how long it took and which processes it started (all stopped)."""

    ended: str
    seconds: float
    processes: list[int] = field(default_factory=list)


Serve = Callable[[SiteConfig, Path, SiteJournal], ServeResult]
"""How a batch run serves: (site configuration, its file, the site's journal) -> result."""


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[IPv6]:PORT``) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def probe_superlink(address: str, timeout: float) -> None:
    """Wait until ``address`` accepts a TCP connection, at most ``timeout`` seconds."""
    host, port = split_address(address)
    deadline = time.monotonic() + timeout
    problem = "no attempt"
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.05, min(5.0, remaining))):
                return
        except OSError as error:
            problem = str(error) or type(error).__name__
        if time.monotonic() + 0.25 > deadline:
            raise CoordinatorUnreachable(
                f"the study's SuperLink at {address} did not accept a connection within "
                f"{timeout:g} s ({problem}); check [coordinator] superlink, the network and "
                "the firewall, or raise connect_timeout"
            )
        time.sleep(0.25)


def serve_over_flower(config: SiteConfig, config_path: Path, journal: SiteJournal) -> ServeResult:
    """Serve the study's requests over Flower until idle or timeout (see the module docstring)."""
    from fedstats.flower import processes

    coordinator = config.coordinator
    if coordinator is None:  # checked by the job; kept for direct callers
        raise CoordinatorUnreachable(f"site {config.name!r}: site.toml has no [coordinator]")
    started_at = time.monotonic()
    probe_superlink(coordinator.superlink, coordinator.connect_timeout)
    home = config.workdir / "flower"
    started = processes.start_supernode(
        home,
        coordinator.superlink,
        coordinator.node_port,
        config_path.resolve(),
        long_lived=True,
        ca=None if coordinator.insecure else coordinator.root_certificates,
        auth_private_key=coordinator.auth_private_key,
    )
    try:
        ended = _watch(config, coordinator, journal, started, home, started_at)
    except SiteProcessesFailed as error:
        error.processes = [p.pid for p in started]
        raise
    finally:
        processes.stop(started)
    return ServeResult(ended, time.monotonic() - started_at, [p.pid for p in started])


def _watch(
    config: SiteConfig,
    coordinator: CoordinatorSection,
    journal: SiteJournal,
    started: list[subprocess.Popen],
    home: Path,
    t0: float,
) -> str:
    size = _size(journal.path)
    requests = RequestLog(config.name, journal)  # requests from now on
    answered_any = False
    last_activity = time.monotonic()
    while True:
        for process in started:
            if process.poll() is not None:
                raise SiteProcessesFailed(
                    f"site {config.name!r}: {_name(process)} ended by itself "
                    f"(exit {process.returncode}) while serving; see its log in {home}: "
                    + _log_tail(home)
                )
        now = time.monotonic()
        current = _size(journal.path)
        if current != size:
            size, last_activity, answered_any = current, now, True
            requests.log_new()
        quiet = answered_any and now - last_activity >= coordinator.idle_timeout
        if quiet and not journal.pending():
            return "idle"
        if now - t0 >= coordinator.serve_timeout:
            return "serve_timeout" if answered_any else "no request"
        time.sleep(WATCH_INTERVAL)


class RequestLog:
    """The serving loop's request log: one ``site.request`` event per request answered (its
    task, analysis, status and the ledger entries charged for it), logged once as its journal
    lines appear, reading only the lines appended since the last call (:class:`JournalTail`).
    Requests journalled before it was made are not logged unless ``from_start``."""

    def __init__(self, site: str, journal: SiteJournal, *, from_start: bool = False) -> None:
        self.site = site
        self.tail = journal.tail()
        self.received: dict[Any, dict[str, Any]] = {}
        if not from_start:
            self._read(log=False)

    def log_new(self) -> None:
        self._read(log=True)

    def _read(self, *, log: bool) -> None:
        for line in self.tail.new_records():
            if line.get("event") == "received":
                self.received[line.get("seq")] = line
            else:
                if log:
                    _log_request(self.site, line, self.received)
                self.received.pop(line.get("seq"), None)


def _log_request(site: str, line: dict[str, Any], received: dict[Any, dict[str, Any]]) -> None:
    """One ``site.request`` event for an ``answered`` or ``rolled_forward`` journal line."""
    if line.get("event") not in ("answered", "rolled_forward"):
        return
    before = received.get(line.get("seq"), {}).get("ledger_entries")
    after = line.get("ledger_entries")
    charged = after - before if isinstance(before, int) and isinstance(after, int) else None
    status = line.get("status", "?")
    outcome = {"released": "answered", "refused": "refused", "error": "failed"}.get(
        status, "not released"
    )
    what = f"{outcome} ({line.get('error_type') or line.get('reason') or '?'})"
    emit(
        _log,
        "site.request",
        f"site {site!r}: request {line.get('seq')} task {line.get('task')!r}"
        + (f" analysis {line['analysis']!r}" if line.get("analysis") else "")
        + f": {what if outcome in ('refused', 'failed') else outcome}"
        + (f", {charged} ledger entr{'y' if charged == 1 else 'ies'} charged" if charged else ""),
        site=site,
        seq=line.get("seq"),
        task=line.get("task"),
        analysis=line.get("analysis"),
        outcome=outcome,
        error_type=line.get("error_type") or None,
        charged_entries=charged,
    )


def _name(process: subprocess.Popen) -> str:
    return "the SuperNode" if "supernode" in " ".join(map(str, process.args)) else "the site worker"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _log_tail(home: Path, characters: int = 1200) -> str:
    parts = []
    for log in sorted(home.glob("*.log")):
        text = log.read_text(encoding="utf-8", errors="replace").strip()
        parts.append(f"[{log.name}] ...{text[-characters:]}")
    return " ".join(parts)
