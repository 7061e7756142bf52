"""The analysis frame a site's batch job serves: harmonised only when its sources changed.

A site configured with a ready ``[data] frame`` serves that file as it is.
A site configured with FHIR or OMOP sources and the study specification
keeps its last harmonised frame at ``workdir/current/frame.parquet``
(:data:`fedstats.jobs.site_service.CURRENT_FRAME`) and, beside it,
``fingerprint.json``: the *source fingerprint* the frame was built from and
the frame file's own SHA-256. The source fingerprint is the SHA-256 of

* every source file's relative name and bytes (folders walked in name order),
* the specification file's bytes,
* the options (``max_rejected_share``, and ``latest_date`` — when it is not
  set, today's date, because records dated after it are rejected today and
  may be accepted tomorrow),
* the installed package version (a new version may harmonise differently).

A run whose source fingerprint equals the recorded one, and whose frame file
still has the recorded SHA-256, reuses the frame; anything else harmonises
again. A new frame is written to a temporary file in the same folder, flushed
to disk and renamed over the old one (an atomic step); ``fingerprint.json``
is written the same way afterwards. A crash at any point therefore leaves
either the old frame with its fingerprint, or a frame whose SHA-256 does not
match the fingerprint (harmonised again next run) — never a half frame in use.

The harmonisation report (``report.json``, ``report.txt``) and the
quarantine of rejected records (``quarantine.csv``) are kept beside the
frame; they never leave the site.

Under a specification with a ``[linkage]`` table (a vertical study) the
identifier table of the frame's patients is kept beside the frame too
(``identifiers.parquet``, file mode 0600: :mod:`fedstats.jobs.site_linkage`),
written the same way before ``fingerprint.json``, which records its SHA-256:
a run reuses the frame only when the identifier table also still has the
recorded SHA-256, and harmonises again otherwise. Under a specification
without one, a table left by an earlier run is removed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

import fedstats
from fedstats.errors import ConfigError, SiteHarmonisationError
from fedstats.jobs.site_config import SiteConfig
from fedstats.jobs.site_linkage import CURRENT_IDENTIFIERS, write_identifiers
from fedstats.jobs.site_service import CURRENT_FRAME
from studyfiles.durable import file_sha256, replace_durably, write_json_atomically

FINGERPRINT_FILE = "fingerprint.json"
Origin = Literal["configured", "harmonised", "reused"]


@dataclass(frozen=True)
class PreparedFrame:
    """The frame this run serves and how it was obtained."""

    path: Path
    sha256: str
    origin: Origin
    source_fingerprint: str | None = None
    harmonisation: dict[str, Any] = field(default_factory=dict)
    identifiers: Path | None = None
    """The identifier table kept beside a harmonised frame (a vertical study), else None."""

    def as_record(self) -> dict[str, Any]:
        """The run record's ``frame`` entry (the identifier table's path, never a value)."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "origin": self.origin,
            "source_fingerprint": self.source_fingerprint,
            "harmonisation": self.harmonisation,
            "identifiers": None if self.identifiers is None else str(self.identifiers),
        }


def source_files(config: SiteConfig) -> list[Path]:
    """Every file of the configured sources, in a stable order; a missing one is a ConfigError."""
    data = config.data
    roots, name = (
        (data.fhir or [], "data.fhir") if data.omop is None else ([data.omop], "data.omop")
    )
    files: list[Path] = []
    for root in roots:
        if root.is_file():
            files.append(root)
        elif root.is_dir():
            files.extend(sorted(p for p in root.rglob("*") if p.is_file()))
        else:
            raise ConfigError(
                f"site {config.name!r}: field {name!r}: {root} does not exist; give the path of "
                "the site's export (a file or a folder)"
            )
    return files


def source_fingerprint(config: SiteConfig, *, today: date | None = None) -> str:
    """The SHA-256 of the sources' bytes, the specification and the options (module docstring)."""
    data = config.data
    if data.spec is None or not data.spec.is_file():
        raise ConfigError(
            f"site {config.name!r}: field 'data.spec': {data.spec} does not exist; give the "
            "study specification the coordinator shared"
        )
    hasher = hashlib.sha256()
    options = {
        "kind": "omop" if data.omop is not None else "fhir",
        "max_rejected_share": data.max_rejected_share,
        "latest_date": str(data.latest_date or today or datetime.now(UTC).date()),
        "fedstats": fedstats.__version__,
    }
    hasher.update(json.dumps(options, sort_keys=True).encode())
    hasher.update(b"\0spec\0" + data.spec.read_bytes())
    for path in source_files(config):
        hasher.update(b"\0file\0" + str(path).encode() + b"\0" + file_sha256(path).encode())
    return hasher.hexdigest()


def prepare_frame(config: SiteConfig, *, failure_dir: Path) -> PreparedFrame:
    """The frame to serve: configured, reused or newly harmonised (see the module docstring).

    Raises :class:`SiteHarmonisationError` when harmonisation fails (its report is
    written to ``failure_dir``) and ``ConfigError`` for a missing frame, source
    or specification.
    """
    if config.data.frame is not None:
        path = config.data.frame
        if not path.is_file():
            raise ConfigError(
                f"site {config.name!r}: field 'data.frame': {path} does not exist; give the "
                "harmonised analysis frame (Parquet or CSV)"
            )
        return PreparedFrame(path, file_sha256(path), "configured")
    current = config.workdir / CURRENT_FRAME
    identifiers = config.workdir / CURRENT_IDENTIFIERS
    fingerprint = source_fingerprint(config)
    recorded = _recorded(current.parent / FINGERPRINT_FILE)
    kept_sha = recorded.get("identifiers_sha256")
    if (
        recorded.get("source_fingerprint") == fingerprint
        and current.is_file()
        and file_sha256(current) == recorded.get("frame_sha256")
        and (kept_sha is None or (identifiers.is_file() and file_sha256(identifiers) == kept_sha))
    ):
        return PreparedFrame(
            current,
            recorded["frame_sha256"],
            "reused",
            fingerprint,
            recorded.get("summary", {}),
            identifiers if kept_sha is not None else None,
        )
    summary, linked = _harmonise(config, current, failure_dir)
    frame_sha = file_sha256(current)
    write_json_atomically(
        current.parent / FINGERPRINT_FILE,
        {
            "source_fingerprint": fingerprint,
            "frame_sha256": frame_sha,
            "identifiers_sha256": file_sha256(identifiers) if linked else None,
            "summary": summary,
        },
    )
    return PreparedFrame(
        current, frame_sha, "harmonised", fingerprint, summary, identifiers if linked else None
    )


def _harmonise(config: SiteConfig, current: Path, failure_dir: Path) -> tuple[dict[str, Any], bool]:
    """Harmonise the sources and write frame, report, quarantine and (under a ``[linkage]``
    table) the identifier table beside ``current``; returns the summary and whether an
    identifier table was kept."""
    from harmonize.errors import HarmonizationError, HarmonizationFailed, SpecError
    from harmonize.run import harmonize, write_failed_outputs, write_report
    from harmonize.spec import load_spec

    data = config.data
    try:
        spec = load_spec(data.spec)
    except SpecError as error:
        raise ConfigError(f"site {config.name!r}: field 'data.spec': {error}") from None
    try:
        result = harmonize(
            spec,
            site=config.name,
            fhir=data.fhir,
            omop=data.omop,
            max_rejected_share=data.max_rejected_share,
            latest_date=data.latest_date,
        )
    except HarmonizationFailed as failed:
        write_failed_outputs(failed, failure_dir)
        raise SiteHarmonisationError(
            f"site {config.name!r}: harmonisation failed: {failed} "
            f"(report in {failure_dir / 'report.json'}). Nothing was served; fix the "
            "sources and run again"
        ) from None
    except HarmonizationError as error:
        raise SiteHarmonisationError(
            f"site {config.name!r}: harmonisation failed: {error}"
        ) from None
    report = result.report
    if report.status != "ok":
        write_report(report, failure_dir)
        raise SiteHarmonisationError(
            f"site {config.name!r}: {report.status}: no patient meets the study's criteria "
            f"(report in {failure_dir / 'report.json'})"
        )
    folder = current.parent
    folder.mkdir(parents=True, exist_ok=True)
    for leftover in folder.glob(f".{current.name}.*.tmp"):  # a crashed run's half frame
        leftover.unlink(missing_ok=True)
    temporary = folder / f".{current.name}.{os.getpid()}.tmp"
    result.frame.to_parquet(temporary)
    replace_durably(temporary, current)
    identifiers = config.workdir / CURRENT_IDENTIFIERS
    if result.identifiers is not None:
        write_identifiers(result.identifiers, identifiers)
    else:  # no [linkage] table now: no names kept from an earlier specification
        identifiers.unlink(missing_ok=True)
    write_report(report, folder)
    result.quarantine.to_csv(folder / "quarantine.csv", index=False)
    return {
        "patients": report.patients,
        "read": report.read,
        "included": report.included,
        "excluded": report.excluded,
        "rejected": report.rejected,
        "spec_digest": report.spec_digest,
    }, result.identifiers is not None


def _recorded(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
