"""Every analysis that left a site, tied to the result it produced.

The message inventory labels each message with its *analysis* (one fit, one
curve, one training; ``Federation.new_analysis``); every recorded result names
the analyses whose answers made it (``analyses`` in its record; a fit recorded
before the field existed names its provenance's one analysis). :func:`analysis_rows`
joins the two: one row per analysis in the inventory, with the tasks its messages
carried, the sites that answered, how many answers left the sites and how many
were refused, and the recorded result it belongs to. An analysis whose answers
left a site but that no recorded result names is *unaccounted*: the verdict
names it with a warning, because the report would otherwise say less left the
sites than did. The sites' fingerprint replies (analysis ``fingerprints``)
belong to the site descriptions of section 5 and the reproducibility section.
"""

from __future__ import annotations

import pandas as pd

from reports.model import AnalysisRow, ReleasedResult, ReleaseSummary
from reports.study import Study
from studyfiles.inventory import MessageInventory

FINGERPRINTS = "fingerprints"
"""The analysis label of the sites' fingerprint replies (``Federation.verify_fingerprints``)."""

ANSWERED = "ok"


def results_by_analysis(study: Study) -> dict[str, tuple[str, str]]:
    """Each analysis label a recorded result names: ``(kind of result, its name)``."""
    owners: dict[str, tuple[str, str]] = {FINGERPRINTS: ("site fingerprints", "section 5")}
    for fit in study.fits:
        for label in fit.analysis_labels:
            owners[label] = ("fitted model", fit.name)
    for curve in study.curves:
        for label in curve.analyses:
            owners[label] = ("survival curve", curve.name)
    for name, diagnostic in study.diagnostics.items():
        for label in diagnostic.analyses:
            owners[label] = ("diagnostic table", name)
    for release in study.releases:
        for label in release.analyses:
            owners[label] = (release.kind, release.name)
    return owners


def analysis_rows(study: Study, inventory: MessageInventory) -> tuple[AnalysisRow, ...]:
    """One row per analysis in ``inventory``, in the order of its first message."""
    owners = results_by_analysis(study)
    rows: dict[str, dict] = {}
    for message in inventory:
        row = rows.setdefault(
            message.analysis,
            {"tasks": {}, "sites": {}, "answered": 0, "refused": 0, "first": message.seq},
        )
        row["tasks"][message.task] = None
        row["sites"][message.site] = None
        if message.status == ANSWERED:
            row["answered"] += 1
        else:
            row["refused"] += 1
    return tuple(
        AnalysisRow(
            analysis=label,
            tasks=tuple(row["tasks"]),
            sites=tuple(sorted(row["sites"])),
            answered=row["answered"],
            refused=row["refused"],
            result_kind=owners.get(label, (None, None))[0],
            result=owners.get(label, (None, None))[1],
        )
        for label, row in sorted(rows.items(), key=lambda item: item[1]["first"])
    )


def unaccounted(rows: tuple[AnalysisRow, ...]) -> tuple[AnalysisRow, ...]:
    """The analyses whose answers left a site but that no recorded result names."""
    return tuple(row for row in rows if row.answered and row.result is None)


def release_summaries(study: Study) -> tuple[ReleaseSummary, ...]:
    """The recorded releases other than fits, curves and diagnostics, for section 8."""
    return tuple(
        ReleaseSummary(
            name=release.name,
            kind=release.kind,
            description=release.description,
            private=release.private,
            sites=tuple(release.sites),
            analyses=tuple(release.analyses),
            table=pd.DataFrame(release.rows, columns=release.columns),
            notes=tuple(release.notes),
        )
        for release in study.releases
    )


EXACT = "exact: disclosure control only"
LEVELS = {"patient": "record-level DP", "site": "client-level DP"}


def released_results(study: Study) -> tuple[ReleasedResult, ...]:
    """Every recorded result in the order the report shows them, with the protection it had:
    the first page's list of what left the sites."""
    rows = []
    for fit in study.fits:
        privacy = fit.result.privacy
        units = [] if privacy is None else [s.unit for s in privacy.scopes]
        rows.append(ReleasedResult(fit.name, "fitted model", fit.description, _protection(units)))
    for curve in study.curves:
        private = curve.result.noise_multiplier is not None
        protection = LEVELS["patient"] if private else EXACT
        rows.append(ReleasedResult(curve.name, "survival curve", curve.description, protection))
    for name, diagnostic in study.diagnostics.items():
        rows.append(ReleasedResult(name, "diagnostic table", diagnostic.title, EXACT))
    for release in study.releases:
        units = [] if release.privacy is None else [s.unit for s in release.privacy.scopes]
        protection = _protection(units) if release.private else EXACT
        rows.append(ReleasedResult(release.name, release.kind, release.description, protection))
    return tuple(rows)


def _protection(units: list[str]) -> str:
    levels = [LEVELS.get(unit, unit) for unit in dict.fromkeys(units)]
    return " and ".join(levels) if levels else EXACT
