"""Making a study's configured record linkages (``[[links]]``) before its fits.

Each ``[[links]]`` entry links the patients of two sites with :func:`fedstats.link`
under the ``[linkage]`` table of the study specification ``[study] spec`` names (the one
the sites harmonised and encode under; each site checks its fingerprint against its own
copy). The linkage record (settings and counts, never a value; counts from 1 to k - 1
suppressed) is written to ``<out>/linkages/<id>.json`` as soon as the linkage completes,
and a linkage whose record exists is not made again — the resume rule of the fits
(:func:`fedstats.jobs.study_fits.run_fits`).

A resumed study whose vertical fits are not all recorded needs the sites to still hold
the linkage they accepted: a site keeps its accepted linkages in its silo, for as long as
its site worker runs. A site that restarted since refuses the fit, naming the linkage;
link again under a new id (or remove the linkage's record).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import fedstats
from fedstats.errors import ConfigError
from fedstats.jobs.study_config import StudyConfig, VerticalLogisticFit
from fedstats.models.federation import Federation

LINKAGES_DIR = "linkages"
STEPS_KEY = "study-steps"
"""The ServerApp's run-config key: ``"links"`` makes only the study's ``[[links]]``
(``fedstats link run``)."""


def linkage_path(out: Path, linkage_id: str) -> Path:
    """Where the record of linkage ``linkage_id`` is written."""
    return out / LINKAGES_DIR / f"{linkage_id}.json"


def study_linkage_table(config: StudyConfig) -> Mapping[str, Any]:
    """The ``[linkage]`` table of the study specification (``[study] spec``).

    Raises
    ------
    ConfigError
        No ``spec``, an unreadable one, or one without a ``[linkage]`` table (naming
        ``study.spec``).
    """
    from harmonize.errors import SpecError
    from harmonize.spec import load_spec

    spec = config.study.spec
    if spec is None:
        raise ConfigError("field 'study.spec': missing; [[links]] encode under its [linkage]")
    try:
        table = load_spec(spec).linkage
    except (SpecError, OSError) as error:
        raise ConfigError(f"field 'study.spec': {error}") from None
    if table is None:
        raise ConfigError(
            f"field 'study.spec': {spec} has no [linkage] table; the sites link only under "
            "the [linkage] table of the specification they harmonised with"
        )
    return table


def roles(config: StudyConfig) -> dict[str, str]:
    """Each site's role in the linkage records: ``outcome`` for a vertical fit's registry,
    ``covariates`` for its hospitals."""
    found: dict[str, str] = {}
    for fit in config.fits:
        if isinstance(fit, VerticalLogisticFit):
            found.setdefault(fit.outcome_site, "outcome")
            for hospital in fit.covariate_sites:
                found.setdefault(hospital, "covariates")
    return found


def run_links(
    config: StudyConfig,
    federation: Federation,
    *,
    on_link: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Make every configured linkage not already recorded under ``config.study.out``.

    Returns every linkage's record, the recorded ones included (read back); ``on_link`` is
    called with each new one.
    """
    if not config.links:
        return {}
    out = Path(config.study.out)
    table = study_linkage_table(config)
    study_roles = roles(config)
    records: dict[str, dict[str, Any]] = {}
    for entry in config.links:
        path = linkage_path(out, entry.id)
        if not path.is_file():
            sites = (entry.first, entry.second)
            fedstats.link(
                federation,
                first=entry.first,
                second=entry.second,
                linkage_id=entry.id,
                schema=table,
                roles={site: study_roles[site] for site in sites if site in study_roles},
                record_dir=out,
            )
            records[entry.id] = _read(path)
            if on_link is not None:
                on_link(entry.id, records[entry.id])
            continue
        records[entry.id] = _read(path)
    return records


def load_linkages(config: StudyConfig) -> dict[str, dict[str, Any]]:
    """Every configured linkage's record under ``out/linkages`` (a missing one is absent)."""
    out = Path(config.study.out)
    return {
        entry.id: _read(linkage_path(out, entry.id))
        for entry in config.links
        if linkage_path(out, entry.id).is_file()
    }


def linkage_lines(records: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per linkage: its pairs and per site the records sent and linked, each count
    from 1 to k - 1 shown as ``< k`` (the record holds it suppressed)."""
    lines = []
    for linkage_id, record in records.items():
        k = record.get("k")

        def count(value: object, k: object = k) -> str:
            return f"< {k}" if value is None else str(value)

        sites = "; ".join(
            f"{site['site']} ({site['role']}): {count(site['records_sent'])} records sent, "
            f"{count(site['linked'])} linked"
            for site in record.get("sites", [])
        )
        lines.append(f"{linkage_id}: {count(record.get('pairs'))} pairs; {sites}")
    return lines


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))
