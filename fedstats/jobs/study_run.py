"""``fedstats study run``: the coordinator's run of a study over Flower, with its report.

1. reads and checks ``study.toml`` (:mod:`fedstats.jobs.study_config`; it must
   have a ``[coordinator]`` section);
2. checks that the SuperLink accepts a connection, then submits the study's
   ServerApp with ``flwr run`` from an ``FLWR_HOME`` of its own
   (``out/.flower``, one connection with the study CA when configured:
   :func:`fedstats.flower.processes.submit_run`);
3. waits for the ServerApp's ``status.json`` of this run under ``out``, at most
   ``[coordinator] run_timeout`` seconds;
4. verifies in the run's message inventory that every site's first message
   was the fingerprint check, answered, before any fit request (the ServerApp
   refuses incompatible sites there, before any data is touched);
5. writes the study directory ``out/study`` and the compliance report
   ``out/compliance-report.html`` (and ``.pdf`` when WeasyPrint works) with
   the :data:`Record` function it is given (the command line gives
   :func:`fedstats.jobs.study_record.record_and_report`, which explains where
   the sites' ledgers are; this module does not import the reports package).

``fedstats link run`` is the same job with ``links_only=True``: the ServerApp makes
only the study's ``[[links]]`` (run config ``study-steps = "links"``) and the job checks
that every linkage was recorded (``out/linkages/<id>.json``); it writes no report.

Exit codes (:class:`StudyExit`):

== ======================================================================
0  success: every fit made, fingerprints checked, report written
2  configuration error (study.toml, a path in it)
5  SuperLink unreachable, or it refused the submission
9  a site was lost or never answered (the message names the site)
10 the run failed: a fit's error, incompatible sites, no status within
   ``run_timeout``, fingerprints not checked first, or the report failed
== ======================================================================
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedstats.errors import (
    ConfigError,
    CoordinatorUnreachable,
    FedstatsError,
    FlowerProcessError,
    RunFailed,
)
from fedstats.jobs.events import emit
from fedstats.jobs.exit_codes import StudyExit
from fedstats.jobs.site_serving import probe_superlink
from fedstats.jobs.study_config import (
    CoordinatorSection,
    StudyConfig,
    load_study_config,
)
from fedstats.jobs.study_config import Fit as FitConfig
from fedstats.jobs.study_fits import result_path
from fedstats.jobs.study_links import (
    LINKAGES_DIR,
    STEPS_KEY,
    load_linkages,
    study_linkage_table,
)
from studyfiles.errors import InventoryFileError
from studyfiles.inventory import MessageInventory

FINGERPRINT_TASK = "harmonize.fingerprint"
CONNECT_TIMEOUT = 30.0
"""Seconds to wait for the SuperLink to accept a connection before submitting."""
_log = logging.getLogger(__name__)
SITE_LOST_ERRORS = frozenset({"SitesMissingError", "SiteLost", "SiteUnreachableError"})
POLL = 0.2


@dataclass(frozen=True)
class Recorded:
    """Where a completed run was recorded: study directory, HTML report, PDF (or why not)."""

    study_dir: Path
    html: Path
    pdf: Path | None
    note: str = ""


Record = Callable[
    [StudyConfig, Path, dict[str, Any], dict[str, dict[str, Any]], MessageInventory], Recorded
]
"""(configuration, study.toml, status, results, inventory) -> where it was recorded.

Raises :class:`RunFailed` when the study directory or the report cannot be written.
"""


@dataclass
class StudyRun:
    """The outcome of ``fedstats study run``."""

    exit_code: StudyExit
    reason: str
    status: dict[str, Any] = field(default_factory=dict)
    study_dir: Path | None = None
    report: Path | None = None
    pdf: Path | None = None


def run_study_job(
    config_path: str | Path, *, record: Record | None, links_only: bool = False
) -> StudyRun:
    """Submit, wait, verify, record and report (see the module docstring); never raises.

    ``links_only``: make only the study's ``[[links]]`` (``record`` is not called).
    """
    config_path = Path(config_path).resolve()
    try:
        config = load_job_config(config_path)
        if links_only and not config.links:
            raise ConfigError(f"{config_path}: field 'links': the study has no [[links]] entry")
        if config.links:
            study_linkage_table(config)
    except ConfigError as error:
        return StudyRun(StudyExit.CONFIGURATION, str(error))
    coordinator = _coordinator(config)
    out = Path(config.study.out)
    emit(
        _log,
        "study.configured",
        f"study {config.study.name!r}: {len(config.fits)} fit(s), sites "
        f"{', '.join(config.study.sites)}",
        study=config.study.name,
        fits=[fit.name for fit in config.fits],
        sites=list(config.study.sites),
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return StudyRun(StudyExit.CONFIGURATION, f"field 'study.out': cannot create it ({error})")
    try:
        probe_superlink(coordinator.superlink, min(CONNECT_TIMEOUT, coordinator.run_timeout))
        emit(
            _log,
            "study.superlink_reachable",
            f"SuperLink {coordinator.superlink} accepts connections; submitting the study",
            superlink=coordinator.superlink,
        )
        run_id = _submit(config, config_path, links_only=links_only)
    except CoordinatorUnreachable as error:
        return StudyRun(StudyExit.SUPERLINK_UNREACHABLE, str(error))
    emit(_log, "study.submitted", f"run {run_id} submitted; waiting for its fits", run_id=run_id)
    try:
        fits = () if links_only else config.fits
        status = wait_for_status(out, run_id, coordinator.run_timeout, fits=fits)
    except RunFailed as error:
        return StudyRun(StudyExit.RUN_FAILED, str(error))
    if status.get("status") != "completed":
        code = (
            StudyExit.SITE_LOST
            if status.get("error_type") in SITE_LOST_ERRORS
            else StudyExit.RUN_FAILED
        )
        problem = f"{status.get('error_type', 'error')}: {status.get('error', 'no detail')}"
        return StudyRun(code, f"study {config.study.name!r}, run {run_id}: {problem}", status)
    try:
        inventory = _inventory(out, run_id)
        check_fingerprints_first(inventory, config.study.sites)
        linked = load_linkages(config)
        unlinked = sorted({entry.id for entry in config.links} - set(linked))
        if unlinked:
            raise RunFailed(f"the run completed but recorded no linkage {unlinked}")
        if links_only:
            return StudyRun(
                StudyExit.OK,
                f"study {config.study.name!r}, run {run_id}: {len(linked)} linkage(s) recorded "
                f"under {out / LINKAGES_DIR}, fingerprints of {len(config.study.sites)} "
                "site(s) checked first",
                status,
            )
        if record is None:
            raise RunFailed("no function to record the study was given")
        results = load_results(config)
        missing = sorted({fit.name for fit in config.fits} - set(results))
        if missing:
            raise RunFailed(f"the run completed but recorded no result for fit(s) {missing}")
        emit(
            _log,
            "study.fingerprints_checked",
            f"every site's fingerprint was checked before any fit; recording {len(results)} "
            "fit(s) and writing the compliance report",
            run_id=run_id,
        )
        recorded = record(config, config_path, status, results, inventory)
    except FedstatsError as error:
        return StudyRun(StudyExit.RUN_FAILED, str(error), status)
    reason = (
        f"study {config.study.name!r}, run {run_id}: {len(results)} fit(s), fingerprints of "
        f"{len(config.study.sites)} site(s) checked first; study directory "
        f"{recorded.study_dir}; report {recorded.html}"
        + (f", {recorded.pdf}" if recorded.pdf else f" ({recorded.note})")
    )
    return StudyRun(StudyExit.OK, reason, status, recorded.study_dir, recorded.html, recorded.pdf)


def load_job_config(path: Path) -> StudyConfig:
    """``study.toml`` with a ``[coordinator]`` section whose files exist."""
    config = load_study_config(path)
    if config.coordinator is None:
        raise ConfigError(
            f"{path}: field 'coordinator': missing; 'fedstats study run' needs [coordinator] "
            "superlink (the SuperLink's control API address)"
        )
    certificates = config.coordinator.root_certificates
    if certificates is not None and not certificates.is_file():
        raise ConfigError(
            f"{path}: field 'coordinator.root_certificates': no file at {certificates}"
        )
    return config


def _coordinator(config: StudyConfig) -> CoordinatorSection:
    if config.coordinator is None:
        raise ConfigError(f"study {config.study.name!r}: field 'coordinator': missing")
    return config.coordinator


def _submit(config: StudyConfig, config_path: Path, *, links_only: bool = False) -> int:
    from fedstats.flower import processes

    coordinator = _coordinator(config)
    home = Path(config.study.out) / ".flower"
    ca = None if coordinator.insecure else coordinator.root_certificates
    processes.write_connection(home, coordinator.superlink, ca=ca)
    try:
        steps = {STEPS_KEY: "links"} if links_only else None
        return processes.submit_run(home, config_path, run_config=steps)
    except (FlowerProcessError, OSError) as error:
        raise CoordinatorUnreachable(
            f"the SuperLink at {coordinator.superlink} did not accept the study: {error}"
        ) from None


def wait_for_status(
    out: Path, run_id: int, timeout: float, *, fits: Sequence[FitConfig] = ()
) -> dict[str, Any]:
    """The ServerApp's ``status.json`` of ``run_id`` once it is no longer running.

    While waiting, logs a ``study.fit_recorded`` event for each of ``fits``
    whose result appears under ``out/results`` (written by this run).
    """
    path = out / "status.json"
    started = time.monotonic()
    deadline = started + timeout
    waiting = {fit.name: result_path(out, fit.name) for fit in fits}
    before = {name: _mtime(result) for name, result in waiting.items()}
    while time.monotonic() < deadline:
        for name in [n for n, result in waiting.items() if _mtime(result) != before[n]]:
            del waiting[name]
            done = len(before) - len(waiting)
            emit(
                _log,
                "study.fit_recorded",
                f"run {run_id}: fit {name!r} done ({done} of {len(before)}, "
                f"{time.monotonic() - started:.0f} s)",
                run_id=run_id,
                fit=name,
                done=done,
                total=len(before),
            )
        try:
            status = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            status = {}
        if status.get("run_id") == run_id and status.get("status") != "running":
            emit(
                _log,
                "study.run_ended",
                f"run {run_id} ended: {status.get('status')}",
                run_id=run_id,
                status=status.get("status"),
                seconds=round(time.monotonic() - started, 1),
            )
            return status
        time.sleep(POLL)
    raise RunFailed(
        f"run {run_id} wrote no final status to {path} within run_timeout = {timeout:g} s; "
        "see the SuperLink's log (the run may still be going: stop it with 'flwr stop')"
    )


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def load_results(config: StudyConfig) -> dict[str, dict[str, Any]]:
    """Every configured fit's recorded result under ``out/results`` (a missing one is absent)."""
    results = {}
    for fit in config.fits:
        path = result_path(Path(config.study.out), fit.name)
        if path.is_file():
            results[fit.name] = json.loads(path.read_text(encoding="utf-8"))
    return results


def _inventory(out: Path, run_id: int) -> MessageInventory:
    path = out / f"inventory-{run_id}.jsonl"
    try:
        return MessageInventory.load(path)
    except (InventoryFileError, OSError) as error:
        raise RunFailed(f"{path}: the run's message inventory cannot be read ({error})") from None


def check_fingerprints_first(inventory: MessageInventory, sites: list[str]) -> None:
    """Every site's first message is the answered fingerprint check, else :class:`RunFailed`."""
    frame = inventory.to_frame()
    for site in sites:
        rows = frame[frame["site"] == site]
        if rows.empty or rows.iloc[0]["task"] != FINGERPRINT_TASK:
            raise RunFailed(
                f"site {site!r}: its first message was not the fingerprint check "
                f"({FINGERPRINT_TASK}); the results cannot be vouched for"
            )
        if rows.iloc[0]["status"] != "ok":
            raise RunFailed(f"site {site!r}: its fingerprint check was not answered")
