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
from studyfiles.fit_records import PrivacyRecord
from studyfiles.inventory import MessageInventory

FINGERPRINTS = "fingerprints"
"""The analysis label of the sites' fingerprint replies (``Federation.verify_fingerprints``)."""

ANSWERED = "ok"


def results_by_analysis(study: Study) -> dict[str, tuple[str, str]]:
    """Each analysis label a recorded result names: ``(kind of result, its name)``."""
    owners: dict[str, tuple[str, str]] = {FINGERPRINTS: ("site fingerprints", "section 5")}
    for result in released_results(study):
        owners.update(dict.fromkeys(result.analyses, (result.kind, result.name)))
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
PRIVATE = "differential privacy"
LEVELS = {"patient": "record-level DP", "site": "client-level DP"}


def released_results(study: Study) -> tuple[ReleasedResult, ...]:
    """Every recorded result in the order the report shows them, with the protection it had
    and the analyses that made it: the first page's list of what left the sites."""
    rows = [
        _released(fit.name, "fitted model", fit.description, fit.result.privacy,
                  fit.analysis_labels, private=fit.result.privacy is not None)
        for fit in study.fits
    ]  # fmt: skip
    rows += [
        ReleasedResult(curve.name, "survival curve", curve.description,
                       LEVELS["patient"] if curve.result.private else EXACT,
                       tuple(curve.analyses), curve.result.private)
        for curve in study.curves
    ]  # fmt: skip
    rows += [
        ReleasedResult(name, "diagnostic table", diagnostic.title, EXACT,
                       tuple(diagnostic.analyses), False)
        for name, diagnostic in study.diagnostics.items()
    ]  # fmt: skip
    rows += [
        _released(release.name, release.kind, release.description, release.privacy,
                  release.analyses, private=release.private)
        for release in study.releases
    ]  # fmt: skip
    return tuple(rows)


def _released(
    name: str, kind: str, description: str, privacy: PrivacyRecord | None,
    analyses: list[str], *, private: bool,
) -> ReleasedResult:  # fmt: skip
    """A result whose privacy account (if any) names the units of its scopes."""
    units = [] if privacy is None else list(dict.fromkeys(s.unit for s in privacy.scopes))
    levels = [LEVELS.get(unit, unit) for unit in units]
    protection = " and ".join(levels) if levels else PRIVATE if private else EXACT
    return ReleasedResult(name, kind, description, protection, tuple(analyses), private)
