"""``fedstats site run``: a hospital's scheduled batch job, from its ``site.toml`` alone.

One run, for cron, a systemd timer or Airflow:

1. reads and checks ``site.toml`` (:mod:`fedstats.jobs.site_config`);
2. takes the exclusive lock ``workdir/site-run.lock`` (:mod:`fedstats.jobs.job_lock`;
   a lock left by a dead run is taken over and the run record says so);
3. closes any request a crashed run left open (``received`` without
   ``answered`` in the journal: :meth:`SiteJournal.roll_forward`);
4. prepares the analysis frame: a configured ``[data] frame`` as it is, else
   the last harmonised frame if the sources, specification and options are
   unchanged, else harmonises them again and writes the new frame atomically
   (:mod:`fedstats.jobs.site_frame`);
5. refuses to serve when its privacy ledger does not verify or does not
   extend the chain heads recorded by the journal and the last run record
   (:mod:`fedstats.jobs.ledger_heads`), and when every privacy budget the
   site holds is spent;
6. serves the study's requests over Flower until the coordinator stops asking
   or ``serve_timeout`` passes (:mod:`fedstats.jobs.site_serving`, which explains
   how the job knows it is done), then stops every process it started;
7. writes the run record ``workdir/runs/<UTC time>.json``: configuration
   hash, frame fingerprint and whether it was harmonised or reused, what was
   served (count and bytes per task), charged (ledger entries and epsilon per
   scope) and refused (task, error type, detail) — derived from the journal
   lines added during the run and the ledger (:mod:`fedstats.jobs.site_activity`) —
   the approved protocol's SHA-256 when the site has one, the ledger's chain
   heads before and after serving (``ledger_heads_before``, ``ledger_heads_after``),
   and the exit code with its reason.

Exit codes (:class:`SiteExit`):

== ======================================================================
0  success (including "nothing new": frame reused, no request)
2  configuration error (site.toml, a path in it, the ledger file)
3  harmonisation failure (rejections above ``max_rejected_share``, an
   unusable file, an empty cohort; the message names file, line and field)
4  budget exhausted: a request was refused for the site's privacy budget,
   or every budget the site holds was already spent (nothing served)
5  coordinator unreachable: no connection to the SuperLink within
   ``connect_timeout``
6  refused by the site's rules: disclosure control (an aggregate over too
   few patients or cells), the approved protocol, the formula grammar or
   the resource limits (nothing was released for it)
7  already running: another run holds the lock (this one did nothing)
8  the site's Flower processes failed, or the job was stopped (SIGTERM)
11 the privacy ledger does not verify, or does not extend the chain head
   recorded in the journal or the last run record (it was edited, rolled
   back or rewritten): nothing was served, or a private request was refused
== ======================================================================

A run with nothing new (same sources, no request from the coordinator)
harmonises nothing, answers nothing, and says so on stdout and in its record.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import accounting
from fedstats.errors import (
    ConfigError,
    EnrolmentError,
    JobAlreadyRunning,
    JobStopped,
    SiteHarmonisationError,
    StudyConfigurationError,
)
from fedstats.jobs.events import emit
from fedstats.jobs.exit_codes import SiteExit
from fedstats.jobs.job_lock import JobLock
from fedstats.jobs.ledger_heads import RUNS_DIR, check_ledger, head_records
from fedstats.jobs.site_activity import Activity, activity, ledger_state, spent_scopes
from fedstats.jobs.site_config import SiteConfig, load_site_config
from fedstats.jobs.site_frame import PreparedFrame, prepare_frame
from fedstats.jobs.site_identity import check_site_identity
from fedstats.jobs.site_journal import JOURNAL_FILE, SiteJournal
from fedstats.jobs.site_linkage import site_linking
from fedstats.jobs.site_service import read_frame
from fedstats.jobs.site_serving import (
    CoordinatorUnreachable,
    Serve,
    ServeResult,
    SiteProcessesFailed,
    serve_over_flower,
)
from fedstats.site.protocol import load_protocol
from studyfiles.durable import file_sha256, write_json_atomically

_log = logging.getLogger(__name__)
LOCK_FILE = "site-run.lock"


@dataclass
class SiteRun:
    """The outcome of one run: exit code, reason, the run record and where it was written."""

    exit_code: SiteExit
    reason: str
    record: dict[str, Any]
    record_path: Path | None = None


def run_site_job(config_path: str | Path, *, serve: Serve = serve_over_flower) -> SiteRun:
    """Run the site's batch job once (see the module docstring); never raises a FedstatsError."""
    config_path = Path(config_path)
    started = datetime.now(UTC)
    record: dict[str, Any] = {"started_at": started.isoformat(), "site_toml": str(config_path)}
    try:
        config = load_job_config(config_path)
    except ConfigError as error:
        return SiteRun(SiteExit.CONFIGURATION, str(error), record)
    record.update(site=config.name, configuration_sha256=file_sha256(config_path))
    runs = config.workdir / RUNS_DIR
    stamp = started.strftime("%Y%m%dT%H%M%S.%fZ")
    try:
        lock = JobLock(config.workdir / LOCK_FILE).acquire()
    except JobAlreadyRunning as error:
        return _finish(SiteRun(SiteExit.ALREADY_RUNNING, str(error), record), runs, stamp)
    except OSError as error:
        message = f"{config.workdir / LOCK_FILE}: cannot take the lock ({error})"
        return SiteRun(SiteExit.CONFIGURATION, f"field 'site.workdir': {message}", record)
    try:
        record["lock"] = {"took_over_from_pid": lock.previous_pid}
        run = _locked_run(config, config_path, serve, record, runs / f"{stamp}-harmonisation")
    finally:
        lock.release()
    return _finish(run, runs, stamp)


def load_job_config(path: Path) -> SiteConfig:
    """``site.toml`` plus what a batch run needs; a ``ConfigError`` names the field."""
    config = load_site_config(path)
    coordinator = config.coordinator
    if coordinator is None:
        raise ConfigError(
            f"{path}: field 'coordinator': missing; a batch run needs [coordinator] superlink "
            "(the study's SuperLink address)"
        )
    for name in ("root_certificates", "auth_private_key", "enrolment"):
        value = getattr(coordinator, name)
        if value is not None and not value.is_file():
            raise ConfigError(f"{path}: field 'coordinator.{name}': no file at {value}")
    try:
        check_site_identity(config)
    except EnrolmentError as error:
        raise ConfigError(f"{path}: field 'coordinator.enrolment': {error}") from None
    try:
        config.workdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{path}: field 'site.workdir': cannot create it ({error})") from None
    if not config.privacy.ledger.parent.is_dir():
        raise ConfigError(
            f"{path}: field 'privacy.ledger': the folder {config.privacy.ledger.parent} "
            "does not exist"
        )
    return config


def _locked_run(
    config: SiteConfig, path: Path, serve: Serve, record: dict[str, Any], failure_dir: Path
) -> SiteRun:
    try:
        ledger = accounting.Ledger(config.privacy.ledger)
    except (accounting.AccountingError, OSError) as error:
        message = f"{path}: field 'privacy.ledger': cannot open {config.privacy.ledger} ({error})"
        return SiteRun(SiteExit.CONFIGURATION, message, record)
    try:
        journal = SiteJournal(config.workdir / JOURNAL_FILE)
        try:
            check_ledger(ledger, config.name, journal, config.workdir / RUNS_DIR)
        except accounting.LedgerIntegrityError as error:
            return SiteRun(
                SiteExit.LEDGER_INTEGRITY,
                f"site {config.name!r}: {error} Nothing was served.",
                record,
            )
        record["ledger_heads_before"] = head_records(ledger)
        record["rolled_forward"] = journal.roll_forward(ledger)
        emit(
            _log,
            "site.preparing_frame",
            f"site {config.name!r}: preparing the analysis frame",
            site=config.name,
            rolled_forward=record["rolled_forward"],
        )
        try:
            frame = prepare_frame(config, failure_dir=failure_dir)
        except ConfigError as error:
            return SiteRun(SiteExit.CONFIGURATION, str(error), record)
        except SiteHarmonisationError as error:
            return SiteRun(SiteExit.HARMONISATION, str(error), record)
        record["frame"] = frame.as_record()
        try:  # a bad identifier table stops the run before it serves (no value recorded)
            site_linking(config, read_frame(frame.path))
        except (ConfigError, StudyConfigurationError) as error:
            return SiteRun(SiteExit.CONFIGURATION, str(error), record)
        emit(
            _log,
            "site.frame_ready",
            f"site {config.name!r}: frame {frame.origin} (sha256 {frame.sha256[:12]})",
            site=config.name,
            origin=frame.origin,
            sha256=frame.sha256,
        )
        if config.disclosure.protocol is not None:
            try:
                protocol = load_protocol(
                    config.disclosure.protocol, sha256=config.disclosure.protocol_sha256
                )
            except StudyConfigurationError as error:
                return SiteRun(SiteExit.CONFIGURATION, f"{path}: [disclosure] {error}", record)
            record["protocol"] = {
                "path": str(config.disclosure.protocol),
                "sha256": protocol.digest,
                "title": protocol.title,
                "analyses": [a.name for a in protocol.analyses],
            }
        before = ledger_state(ledger)
        spent = spent_scopes(before, config.name)
        if spent:
            scopes = ", ".join(f"{s.unit}/{s.owner}/{s.study}" for s in spent)
            return SiteRun(
                SiteExit.BUDGET_EXHAUSTED,
                f"site {config.name!r}: every privacy budget it holds is spent ({scopes}); "
                "nothing was served. The site's privacy officer decides whether to set a new "
                "budget (fedstats budget show --ledger ...).",
                record,
            )
        known = len(journal.records())
        emit(
            _log,
            "site.serving",
            f"site {config.name!r}: serving the study's requests from "
            f"{config.coordinator.superlink if config.coordinator else '?'}",
            site=config.name,
        )
        try:
            with _stopped_by_sigterm():
                served = serve(config, path, journal)
        except CoordinatorUnreachable as error:
            return SiteRun(SiteExit.COORDINATOR_UNREACHABLE, str(error), record)
        except (SiteProcessesFailed, JobStopped) as error:
            _record_activity(record, journal, known, before, ledger)
            record["serving"] = {
                "ended": "failed" if isinstance(error, SiteProcessesFailed) else "stopped",
                "processes": getattr(error, "processes", []),
            }
            return SiteRun(SiteExit.SERVE_FAILED, str(error), record)
        done = _record_activity(record, journal, known, before, ledger)
        record["serving"] = {
            "ended": served.ended,
            "seconds": served.seconds,
            "processes": served.processes,
        }
        return _judge(config.name, frame, served, done, record)
    finally:
        ledger.close()


def _record_activity(
    record: dict[str, Any],
    journal: SiteJournal,
    known: int,
    before: dict,
    ledger: accounting.Ledger,
) -> Activity:
    done = activity(journal.records()[known:], before, ledger_state(ledger))
    record.update(done.as_record())
    record["ledger_heads_after"] = head_records(ledger)
    return done


def _judge(
    site: str, frame: PreparedFrame, served: ServeResult, done: Activity, record: dict[str, Any]
) -> SiteRun:
    """Exit code and reason of a run that served."""
    if done.ledger_refusals:
        first = done.ledger_refusals[0]
        return SiteRun(
            SiteExit.LEDGER_INTEGRITY,
            f"site {site!r}: {len(done.ledger_refusals)} private request(s) refused because the "
            f"privacy ledger does not verify (first: task {first['task']!r}); the site's log "
            "says what disagrees. Restore the ledger from a backup before serving again.",
            record,
        )
    if done.budget_refusals:
        first = done.budget_refusals[0]
        return SiteRun(
            SiteExit.BUDGET_EXHAUSTED,
            f"site {site!r}: {len(done.budget_refusals)} request(s) refused for the privacy "
            f"budget (first: task {first['task']!r}, {first['error_type']}: {first['detail']})",
            record,
        )
    if done.disclosure_refusals:
        first = done.disclosure_refusals[0]
        return SiteRun(
            SiteExit.DISCLOSURE_REFUSED,
            f"site {site!r}: {len(done.disclosure_refusals)} request(s) refused by the site's "
            f"rules (first: task {first['task']!r}, reason {first['reason'] or '?'}: "
            f"{first['detail']})",
            record,
        )
    frame_words = {
        "reused": f"frame reused (sha256 {frame.sha256})",
        "configured": f"configured frame used as is (sha256 {frame.sha256})",
        "harmonised": f"frame harmonised (sha256 {frame.sha256})",
    }[frame.origin]
    if done.requests == 0 and frame.origin != "harmonised":
        record["nothing_new"] = True
        return SiteRun(
            SiteExit.OK, f"nothing new: {frame_words}, no request from the coordinator", record
        )
    tasks = ", ".join(f"{task} x{row['count']}" for task, row in sorted(done.served.items()))
    ended = {
        "idle": "the coordinator stopped asking",
        "serve_timeout": "serve_timeout reached",
        "no request": "no request from the coordinator",
    }.get(served.ended, served.ended)
    return SiteRun(
        SiteExit.OK,
        f"{frame_words}; served {done.requests} request(s) ({tasks or 'none'}), "
        f"{len(done.refused)} refused, {done.entries_added} ledger entr(y/ies) charged; "
        f"serving ended: {ended}",
        record,
    )


def _finish(run: SiteRun, runs: Path, stamp: str) -> SiteRun:
    """Add the outcome to the record and write it to ``runs/<stamp>.json`` (atomically)."""
    run.record.update(
        finished_at=datetime.now(UTC).isoformat(),
        exit_code=int(run.exit_code),
        exit_name=run.exit_code.name.lower(),
        reason=run.reason,
    )
    path = runs / f"{stamp}.json"
    write_json_atomically(path, run.record, default=str)
    run.record_path = path
    return run


@contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """Turn SIGTERM into :class:`JobStopped`, so the processes started are stopped on the way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(_signal: int, _frame: FrameType | None) -> None:
        raise JobStopped("the job received SIGTERM while serving; its processes were stopped")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
