"""The check that a compliance report names everything that left the sites.

Shared by the in-process study (``test_every_release.py``) and the Flower studies
(``tests/flower``): for every analysis whose answers left a site in the recorded
message inventory, the report's section 6 ties it to a recorded result, section 8
shows that result, and the verdict names it; every task whose answers left a site
is listed in section 6.
"""

from __future__ import annotations

import re
from pathlib import Path

from reports import Study, build_report, render_html
from reports.model import ComplianceReport

FINGERPRINTS = "fingerprints"


def section(html: str, start: str, end: str) -> str:
    """The HTML between the headings with ids ``start`` and ``end``."""
    begin = html.index(f'id="{start}"')
    return html[begin : html.index(f'id="{end}"', begin)]


def assert_every_release_named(study_dir: Path) -> tuple[ComplianceReport, set[str]]:
    """Check the report of ``study_dir``; returns it and the tasks whose answers left a site."""
    study = Study.load(study_dir)
    assert study.inventory is not None and len(study.inventory), "no message inventory recorded"
    report = build_report(study)
    html = render_html(report)
    flows = section(html, "flows", "harmonisation")
    results = section(html, "results", "hazards")
    verdict = report.verdict.text if report.verdict else ""
    answered = [m for m in study.inventory if m.status == "ok"]
    rows = {row.analysis: row for row in report.analyses}
    for label in dict.fromkeys(m.analysis for m in answered):
        row = rows[label]
        assert row.result is not None, f"{label} ({', '.join(row.tasks)}) is tied to no result"
        assert re.search(rf"<td>{re.escape(label)}</td>", flows), f"{label} not in section 6"
        if label == FINGERPRINTS:
            continue
        assert f"<strong>{row.result}</strong>" in flows, (label, row.result)
        assert row.result in verdict, f"the verdict does not name {row.result} ({label})"
        assert row.result in results, f"section 8 does not show {row.result} ({label})"
    tasks = {m.task for m in answered}
    for task in tasks:
        assert task in flows, f"task {task} not listed in section 6"
    assert "WARNING: answers to" not in verdict, verdict
    return report, tasks
