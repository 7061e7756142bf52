"""The sites' ledger chain heads the coordinator recorded, compared with the ledgers read.

Each private reply carries the site's ledger chain head after its charge
(entry count and hash, :class:`accounting.ChainHead`); the study record keeps
the latest per site (``ledger-heads.json``). A hash chain makes a head commit
to every entry before it (Haber & Stornetta 1991), so a ledger that still
holds the recorded history *extends* the head; one rewritten after the
release (entries deleted, its scope reset to genesis, a consistent forgery)
does not, even when it verifies on its own. The report says so on page 1.
"""

from __future__ import annotations

import accounting
from reports.model import HeadCheck
from reports.study import Study

NOT_HERE = (
    "not compared here: the site's ledger stays at the site, which compares this head "
    "at its next run (fedstats site run)"
)


def head_checks(study: Study) -> tuple[HeadCheck, ...]:
    """One :class:`HeadCheck` per recorded head, in the order recorded."""
    checks = []
    for head in study.recorded_heads:
        scope = head.scope
        path = next(
            (
                record.ledger
                for record in study.scopes
                if (record.scope.unit, record.scope.owner, record.scope.study)
                == (scope.unit, scope.owner, scope.study)
            ),
            None,
        )
        if path is None:
            owner_file = next(
                (ledger.path for ledger in study.ledgers if ledger.path.stem == scope.owner), None
            )
            if owner_file is None:
                checks.append(_check(head, "not compared", NOT_HERE))
                continue
            path = owner_file
        with accounting.Ledger(path) as ledger:
            problem = ledger.rewritten_since(head)
        checks.append(_check(head, "extends" if problem is None else "rewritten", problem))
    return tuple(checks)


def _check(head: accounting.ChainHead, state: str, problem: str | None) -> HeadCheck:
    return HeadCheck(head.scope.owner, head.scope.study, head.entries, head.head, state, problem)
