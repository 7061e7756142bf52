"""The site's ledger chain heads, recorded outside the ledger and compared at the next run.

A ledger checks its own file (:class:`accounting.Ledger` recomputes every
scope from its hash-chained entries), but a file rewritten wholesale and
consistently agrees with itself. So the site records each scope's chain
head (:class:`accounting.ChainHead`: entry count and last hash) outside the
ledger file, at every release: on each ``answered`` line of its journal
(:mod:`fedstats.jobs.site_service`) and in each run record
(``ledger_heads_before`` and ``ledger_heads_after``,
:mod:`fedstats.jobs.site_batch`). Each private reply carries the study
scope's head too, and the coordinator keeps it in its study record.

:func:`check_ledger` runs before a batch run serves, and when the site's
service opens the ledger (a Flower ClientApp may build a new service for each
message): the ledger must verify and extend the last head the journal and the
last run record hold. A hash
chain makes each head commit to all the history before it (Haber &
Stornetta 1991), so a ledger that extends the recorded head has kept every
charge made up to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import accounting
from fedstats.jobs.site_journal import SiteJournal

RUNS_DIR = "runs"
"""The folder of a site's work directory holding its batch runs' records."""

HEADS_FIELD = "ledger_heads"
"""The journal field (and the run records' ``ledger_heads_before`` / ``_after``) of heads."""


def head_records(ledger: accounting.Ledger) -> list[dict[str, Any]]:
    """Every scope's chain head as plain values, to record outside the ledger."""
    return [head.to_record() for head in ledger.heads()]


def _heads(records: object, where: str) -> list[accounting.ChainHead]:
    if not isinstance(records, list):
        raise accounting.LedgerRewritten(
            path=where, scope=None, problems=(f"{where}: its recorded chain heads are unreadable",)
        )
    try:
        return [accounting.ChainHead.from_record(record) for record in records]
    except ValueError as error:
        raise accounting.LedgerRewritten(
            path=where,
            scope=None,
            problems=(f"{where}: a recorded chain head is unreadable ({error})",),
        ) from None


def last_recorded(journal: SiteJournal, runs: Path) -> list[tuple[str, list[accounting.ChainHead]]]:
    """The last heads the journal holds and those of the latest run record that has any.

    Returns (where, heads) pairs; a run record that cannot be read as JSON is
    passed over (a torn write), the next older one is used.
    """
    found: list[tuple[str, list[accounting.ChainHead]]] = []
    for record in reversed(journal.records()):
        if HEADS_FIELD in record:
            where = f"{journal.path} (request {record.get('seq', '?')})"
            found.append((where, _heads(record[HEADS_FIELD], where)))
            break
    for path in sorted(runs.glob("*.json"), reverse=True) if runs.is_dir() else []:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        heads = (
            record.get(f"{HEADS_FIELD}_after") or record.get(f"{HEADS_FIELD}_before")
            if isinstance(record, dict)
            else None
        )
        if heads:
            found.append((str(path), _heads(heads, str(path))))
            break
    return found


def check_ledger(ledger: accounting.Ledger, site: str, journal: SiteJournal, runs: Path) -> None:
    """Refuse a ledger that does not verify or does not extend the heads recorded before.

    Raises
    ------
    accounting.LedgerIntegrityError
        If one of the site's scopes disagrees with its own entries.
    accounting.LedgerRewritten
        If the ledger does not extend the last head recorded in the journal or
        the last run record (entries removed, history rewritten, scope gone).
    """
    for scope, problems in ledger.integrity_problems().items():
        if problems and scope.owner == site:
            raise accounting.LedgerIntegrityError(
                path=str(ledger.path), scope=scope, problems=problems
            )
    for where, heads in last_recorded(journal, runs):
        ledger.check_extends([h for h in heads if h.scope.owner == site], where=where)
