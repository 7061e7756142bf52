"""``fedstats link check``: what a site would encode for a record linkage, never a value.

For the site's data engineer, from ``site.toml`` alone: takes the site's lock (no run
overlaps), prepares the frame as ``fedstats site run`` does (harmonised only when the
sources changed, else reused; :mod:`fedstats.jobs.site_frame`), reads the identifier table
kept beside it (or named in ``[data] identifiers``) and checks it against the frame and the
``[linkage]`` table of the site's specification (:mod:`fedstats.jobs.site_linkage`). It
reports the number of patients the site would encode, per identifier field how many have
no value (those fields add nothing to an encoding, and a field missing for many patients
lowers the linkage's recall), and the schema's SHA-256 fingerprint, which the linkage unit
and the other site must show too. Nothing is sent; no identifier value is printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fedstats.contract.tasks.record_linkage import linkage_schema
from fedstats.errors import ConfigError, JobAlreadyRunning, SiteHarmonisationError
from fedstats.jobs.exit_codes import SiteExit
from fedstats.jobs.job_lock import JobLock
from fedstats.jobs.ledger_heads import RUNS_DIR
from fedstats.jobs.site_batch import LOCK_FILE
from fedstats.jobs.site_config import load_site_config
from fedstats.jobs.site_frame import prepare_frame
from fedstats.jobs.site_linkage import identifiers_path, site_linking
from fedstats.jobs.site_service import read_frame
from linkage.schema import IDENTIFIER_COLUMNS


@dataclass(frozen=True)
class LinkageCheck:
    """What the site would encode: counts and the schema's fingerprint only."""

    site: str
    patients: int
    missing: dict[str, int]
    fingerprint: str
    frame_origin: str
    identifiers: Path


@dataclass(frozen=True)
class CheckOutcome:
    """The exit code, and the check or why it could not be made."""

    exit_code: SiteExit
    reason: str
    check: LinkageCheck | None = None


def check_site_linkage(config_path: str | Path) -> CheckOutcome:
    """Prepare the frame and check the identifier table (module docstring); never raises a
    FedstatsError."""
    try:
        config = load_site_config(config_path)
        config.workdir.mkdir(parents=True, exist_ok=True)
    except ConfigError as error:
        return CheckOutcome(SiteExit.CONFIGURATION, str(error))
    except OSError as error:
        return CheckOutcome(SiteExit.CONFIGURATION, f"field 'site.workdir': {error}")
    try:
        lock = JobLock(config.workdir / LOCK_FILE).acquire()
    except JobAlreadyRunning as error:
        return CheckOutcome(SiteExit.ALREADY_RUNNING, str(error))
    try:
        if identifiers_path(config) is None:
            return CheckOutcome(
                SiteExit.CONFIGURATION,
                f"site {config.name!r}: takes part in no record linkage: field 'data.spec' "
                "names no specification with a [linkage] table (or a ready frame names no "
                "field 'data.identifiers')",
            )
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        failure_dir = config.workdir / RUNS_DIR / f"{stamp}-harmonisation"
        frame = prepare_frame(config, failure_dir=failure_dir)
        identifiers, table = site_linking(config, read_frame(frame.path))
    except ConfigError as error:
        return CheckOutcome(SiteExit.CONFIGURATION, str(error))
    except SiteHarmonisationError as error:
        return CheckOutcome(SiteExit.HARMONISATION, str(error))
    finally:
        lock.release()
    if identifiers is None or table is None:  # site_linking gives both or neither
        return CheckOutcome(SiteExit.CONFIGURATION, f"site {config.name!r}: no identifier table")
    check = LinkageCheck(
        site=config.name,
        patients=len(identifiers),
        missing={c: int((identifiers[c] == "").sum()) for c in IDENTIFIER_COLUMNS},
        fingerprint=linkage_schema(table).fingerprint(),
        frame_origin=frame.origin,
        identifiers=identifiers_path(config) or Path(),
    )
    return CheckOutcome(SiteExit.OK, f"site {config.name!r}: ready to link", check)
