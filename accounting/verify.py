"""Ledger verification: recompute everything a ledger claims from what it records.

Checks, reported as readable problems rather than raised:

* SQLite's ``PRAGMA integrity_check`` and ``foreign_key_check``;
* per scope: sequence numbers 1..n without gaps and n equal to the scope's
  count; the hash chain (:mod:`accounting.chain`) recomputed from genesis to the
  head stored with the scope; every event's JSON decodes and is accountable;
* the stored cumulative RDP curve equals the sum of the entries' curves
  recomputed from their events (relative 1e-9), and each entry's
  ``epsilon_after`` equals the epsilon of the running sum at the entry's delta
  (hence non-decreasing while delta is unchanged), the last one equal to the
  scope's current epsilon;
* the current epsilon is within the budget, and the budget is the last one in
  the budget history;
* no entry was deleted from the file, read from SQLite's id counter
  (:func:`deleted_entries`, a heuristic).

A :class:`~accounting.ledger.Ledger` makes the same per-scope check when it
is opened (:func:`check_scope`) and refuses to charge a scope that fails it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from accounting.accountants import (
    BUDGET_SLACK,
    cached_event_epsilon,
    cached_rdp_curve,
    epsilon_from_rdp,
)
from accounting.chain import chain_hash, entry_content, genesis_hash
from accounting.errors import AccountingError
from accounting.records import VerifyReport
from accounting.scope import Scope

_RTOL = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_RTOL, abs_tol=1e-12)


SCOPE_QUERY = (
    "SELECT id, unit, owner, study, neighbouring, budget_epsilon, budget_delta, orders, rdp, "
    "epsilon, entries, last_hash FROM scopes"
)
"""A scope row in the column order :func:`check_scope` reads."""
ENTRY_QUERY = (
    "SELECT seq, event_json, epsilon, delta, epsilon_after, note, analysis, task, "
    "parameters, created_at, package_version, prev_hash, entry_hash "
    "FROM entries WHERE scope_id = ? AND seq > ? ORDER BY seq"
)
"""A scope's entries after a sequence number, in the column order :func:`walk_chain` reads."""


def verify_ledger(conn: sqlite3.Connection, path: Path) -> VerifyReport:
    """Verify the ledger open on ``conn`` (inside a read transaction)."""
    problems: list[str] = []
    integrity = [str(row[0]) for row in conn.execute("PRAGMA integrity_check").fetchall()]
    if integrity != ["ok"]:
        problems.append(f"{path}: SQLite integrity check failed: {'; '.join(integrity[:10])}")
    for table, rowid, parent, _ in conn.execute("PRAGMA foreign_key_check").fetchall():
        problems.append(f"{path}: {table} row {rowid} refers to a missing {parent} row")
    scopes = conn.execute(f"{SCOPE_QUERY} ORDER BY id").fetchall()
    for row in scopes:
        problems.extend(check_scope(conn, row, entry_epsilons=True).problems)
    problems.extend(deleted_entries(conn, path))
    (entries,) = conn.execute("SELECT COUNT(*) FROM entries").fetchone()
    return VerifyReport(ok=not problems, problems=problems, scopes=len(scopes), entries=entries)


def deleted_entries(conn: sqlite3.Connection, path: Path) -> list[str]:
    """Entries removed from the file, read from SQLite's id counter (a heuristic).

    Entry ids come from ``AUTOINCREMENT``: 1, 2, ... in commit order, never
    reused, and a refused or rolled-back charge takes none (the counter,
    ``sqlite_sequence``, is updated in the same transaction). The ledger never
    deletes an entry, so the counter equals the number of entries and the
    largest id. When it does not, entries were deleted, even if every scope
    row was then rewritten to match what is left. An editor who also resets
    ``sqlite_sequence`` escapes this check; only a head recorded outside the
    file (:class:`~accounting.records.ChainHead`) detects that.
    """
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'entries'").fetchone()
    counter = 0 if row is None else int(row[0])
    count, largest = conn.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM entries").fetchone()
    if counter == count == largest:
        return []
    owners = conn.execute("SELECT unit, owner, study FROM scopes ORDER BY id").fetchall()
    named = "; ".join(f"unit={u}, owner={o}, study={s}" for u, o, s in owners) or "none left"
    return [
        f"{path}: the entries' id counter is at {counter} but {count} entries are stored "
        f"(largest id {largest}): entries were deleted from the file; any of its scopes "
        f"({named}) may have lost charges"
    ]


@dataclass
class ChainWalk:
    """What a scope's entries compose to, from a verified starting point.

    ``entries`` and ``head`` are the last entry's sequence number and hash,
    ``rdp`` the cumulative RDP curve, ``last_after`` the last entry's
    (epsilon_after, delta); ``problems`` what did not chain or compose.
    """

    entries: int
    head: str
    rdp: np.ndarray
    last_after: tuple[float, float] | None = None
    problems: list[str] = field(default_factory=list)


def walk_chain(
    label: str,
    scope: Scope,
    orders: tuple[float, ...],
    rows: list[tuple],
    start: ChainWalk,
    *,
    entry_epsilons: bool,
) -> ChainWalk:
    """Extend ``start`` by ``rows`` (:data:`ENTRY_QUERY` order): sequence, hashes and curves.

    Each entry must carry the next sequence number, chain to the hash before
    it and hash to its stored hash (:mod:`accounting.chain`); its event's RDP
    curve is added to the running sum (RDP composes additively order by
    order, Mironov 2017, Prop. 1). With ``entry_epsilons`` each entry's
    recorded epsilons are also recomputed (one epsilon conversion per entry:
    the full check of :meth:`Ledger.verify`).
    """
    walk = ChainWalk(start.entries, start.head, start.rdp.copy(), start.last_after)
    seqs = [r[0] for r in rows]
    expected = list(range(start.entries + 1, start.entries + len(rows) + 1))
    if seqs != expected:
        present = set(seqs)
        top = start.entries + len(rows)  # the numbers the entries should hold, up to top
        missing = [s for s in range(start.entries + 1, top + 1) if s not in present]  # O(rows)
        walk.problems.append(
            f"{label}: entry sequence numbers are not 1..{start.entries + len(rows)} without gaps"
            + (f" (missing {', '.join(map(str, missing[:10]))})" if missing else "")
        )
    curves_ok = True
    for row_ in rows:
        seq, event_json, eps, dlt, after, note, analysis, task, params, at, version, prev, h = row_
        if prev != walk.head:
            walk.problems.append(f"{label}: entry {seq} does not chain to the entry before it")
        try:
            content = entry_content(
                scope=scope,
                seq=seq,
                event_json=event_json,
                epsilon=eps,
                delta=dlt,
                epsilon_after=after,
                note=note,
                analysis=analysis,
                task=task,
                parameters_json=params,
                created_at=at,
                package_version=version,
            )
            recomputed = chain_hash(prev, content)
        except (TypeError, ValueError) as error:
            recomputed = f"unhashable ({error})"
        if recomputed != h:
            walk.problems.append(
                f"{label}: entry {seq} was changed after it was written (hash differs)"
            )
        walk.head, walk.entries = h, seq
        try:
            walk.rdp = walk.rdp + cached_rdp_curve(event_json, orders, scope.neighbouring)
        except AccountingError as error:
            walk.problems.append(f"{label}: entry {seq}: its event cannot be accounted ({error})")
            curves_ok = False
            continue
        if entry_epsilons:
            _check_entry_epsilons(label, walk, orders, scope, seq, event_json, eps, dlt, after)
        walk.last_after = (after, dlt)
    if not curves_ok:
        walk.rdp = np.full(len(orders), np.nan)
    return walk


def _check_entry_epsilons(
    label: str,
    walk: ChainWalk,
    orders: tuple[float, ...],
    scope: Scope,
    seq: int,
    event_json: str,
    eps: float,
    dlt: float,
    after: float,
) -> None:
    try:
        expected = epsilon_from_rdp(orders, walk.rdp, dlt)
        alone = cached_event_epsilon(event_json, orders, scope.neighbouring, dlt)
    except AccountingError as error:
        walk.problems.append(f"{label}: entry {seq}: its event cannot be accounted ({error})")
        return
    if not _close(after, expected):
        walk.problems.append(
            f"{label}: entry {seq} records epsilon_after={after!r} but the events up to it "
            f"compose to {expected!r}"
        )
    if not _close(eps, alone):
        walk.problems.append(
            f"{label}: entry {seq} records epsilon={eps!r}; its event has epsilon={alone!r}"
        )
    last = walk.last_after
    if last is not None and last[1] == dlt and after < last[0] - 1e-12:
        walk.problems.append(f"{label}: entry {seq}: epsilon_after decreases")


@dataclass
class ScopeCheck:
    """A scope's row checked against its entries: the walk, and every disagreement."""

    scope: Scope | None
    walk: ChainWalk | None
    problems: list[str]


def scope_label(unit: object, owner: object, study: object) -> str:
    return f"scope (unit={unit}, owner={owner}, study={study})"


def check_scope(conn: sqlite3.Connection, row: tuple, *, entry_epsilons: bool) -> ScopeCheck:
    """Recompute a scope (:data:`SCOPE_QUERY` row) from its entries and compare its stored state.

    The stored entry count, chain head, cumulative RDP curve (relative 1e-9)
    and epsilon must be what the entries compose to, the epsilon within the
    budget, and the budget the last one in the budget history. This is the
    check a :class:`~accounting.ledger.Ledger` makes at open (without
    ``entry_epsilons``) and :meth:`Ledger.verify` makes in full.
    """
    sid, unit, owner, study, neighbouring, budget, delta, orders_json, rdp, epsilon, count, head = (
        row
    )
    label = scope_label(unit, owner, study)
    try:
        scope = Scope(unit, owner, study, neighbouring)
        orders = tuple(float(order) for order in json.loads(orders_json))
        stored = np.frombuffer(rdp, dtype="<f8")
    except (AccountingError, TypeError, ValueError) as error:
        return ScopeCheck(None, None, [f"{label}: unreadable scope row ({error})"])
    if len(stored) != len(orders):
        return ScopeCheck(
            scope, None, [f"{label}: {len(stored)} RDP values stored for {len(orders)} orders"]
        )
    rows = conn.execute(ENTRY_QUERY, (sid, 0)).fetchall()
    genesis = ChainWalk(0, genesis_hash(scope), np.zeros(len(orders)))
    walk = walk_chain(label, scope, orders, rows, genesis, entry_epsilons=entry_epsilons)
    problems = list(walk.problems)
    if count != len(rows):
        problems.append(f"{label}: the scope counts {count} entries but {len(rows)} are stored")
    problems += stored_state_problems(
        conn, label, sid, orders, walk, stored, head, epsilon, budget, delta
    )
    return ScopeCheck(scope, walk, problems)


def stored_state_problems(
    conn: sqlite3.Connection,
    label: str,
    sid: int,
    orders: tuple[float, ...],
    walk: ChainWalk,
    stored: np.ndarray,
    head: str,
    epsilon: float,
    budget: float,
    delta: float,
) -> list[str]:
    """Where a scope row's cached state (head, curve, epsilon, budget) disagrees with ``walk``."""
    problems: list[str] = []
    if head != walk.head:
        problems.append(
            f"{label}: the chain head stored with the scope is not the last entry's hash "
            "(entries removed or added outside the ledger)"
        )
    if not np.all(np.isnan(walk.rdp)) and not np.allclose(stored, walk.rdp, rtol=_RTOL, atol=0.0):
        problems.append(
            f"{label}: the stored cumulative RDP curve is not the sum of its entries' curves"
        )
    try:
        current = epsilon_from_rdp(orders, stored, delta)
    except AccountingError as error:
        problems.append(f"{label}: the budget's delta is invalid ({error})")
        return problems
    if not _close(current, epsilon):
        problems.append(
            f"{label}: stored epsilon {epsilon!r} differs from its RDP curve's {current!r}"
        )
    last_after = walk.last_after
    if last_after is not None and last_after[1] == delta and not _close(last_after[0], epsilon):
        problems.append(
            f"{label}: the last entry's epsilon_after {last_after[0]!r} is not the scope's "
            f"epsilon {epsilon!r}"
        )
    if not epsilon <= budget + BUDGET_SLACK:
        problems.append(f"{label}: epsilon {epsilon!r} exceeds the budget {budget!r}")
    problems += budget_history_problems(conn, label, sid, budget, delta)
    return problems


def budget_history_problems(
    conn: sqlite3.Connection, label: str, sid: int, budget: float, delta: float
) -> list[str]:
    """The scope's budget must be the last one its budget history records."""
    latest = conn.execute(
        "SELECT epsilon, delta FROM budget_history WHERE scope_id = ? ORDER BY id DESC LIMIT 1",
        (sid,),
    ).fetchone()
    if latest is None or tuple(latest) != (budget, delta):
        return [f"{label}: the budget is not the last one in the budget history"]
    return []
