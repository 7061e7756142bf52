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
  the budget history.
"""

from __future__ import annotations

import json
import math
import sqlite3
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


def verify_ledger(conn: sqlite3.Connection, path: Path) -> VerifyReport:
    """Verify the ledger open on ``conn`` (inside a read transaction)."""
    problems: list[str] = []
    integrity = [str(row[0]) for row in conn.execute("PRAGMA integrity_check").fetchall()]
    if integrity != ["ok"]:
        problems.append(f"{path}: SQLite integrity check failed: {'; '.join(integrity[:10])}")
    for table, rowid, parent, _ in conn.execute("PRAGMA foreign_key_check").fetchall():
        problems.append(f"{path}: {table} row {rowid} refers to a missing {parent} row")
    scopes = conn.execute(
        "SELECT id, unit, owner, study, neighbouring, budget_epsilon, budget_delta, orders, rdp, "
        "epsilon, entries, last_hash FROM scopes ORDER BY id"
    ).fetchall()
    for row in scopes:
        problems.extend(_verify_scope(conn, row))
    (entries,) = conn.execute("SELECT COUNT(*) FROM entries").fetchone()
    return VerifyReport(ok=not problems, problems=problems, scopes=len(scopes), entries=entries)


def _verify_scope(conn: sqlite3.Connection, row: tuple) -> list[str]:
    sid, unit, owner, study, neighbouring, budget, delta, orders_json, rdp, epsilon, count, head = (
        row
    )
    label = f"scope (unit={unit}, owner={owner}, study={study})"
    try:
        scope = Scope(unit, owner, study, neighbouring)
        orders = tuple(float(order) for order in json.loads(orders_json))
        stored = np.frombuffer(rdp, dtype="<f8")
    except (AccountingError, TypeError, ValueError) as error:
        return [f"{label}: unreadable scope row ({error})"]
    if len(stored) != len(orders):
        return [f"{label}: {len(stored)} RDP values stored for {len(orders)} orders"]

    problems: list[str] = []
    rows = conn.execute(
        "SELECT seq, event_json, epsilon, delta, epsilon_after, note, analysis, task, "
        "parameters, created_at, package_version, prev_hash, entry_hash "
        "FROM entries WHERE scope_id = ? ORDER BY seq",
        (sid,),
    ).fetchall()
    seqs = [r[0] for r in rows]
    if seqs != list(range(1, len(rows) + 1)):
        missing = sorted(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
        problems.append(
            f"{label}: entry sequence numbers are not 1..{len(rows)} without gaps"
            + (f" (missing {', '.join(map(str, missing[:10]))})" if missing else "")
        )
    if count != len(rows):
        problems.append(f"{label}: the scope counts {count} entries but {len(rows)} are stored")

    previous = genesis_hash(scope)
    for row_ in rows:
        seq, event_json, eps, dlt, after, note, analysis, task, params, at, version, prev, h = row_
        if prev != previous:
            problems.append(f"{label}: entry {seq} does not chain to the entry before it")
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
            problems.append(f"{label}: entry {seq} was changed after it was written (hash differs)")
        previous = h
    if head != previous:
        problems.append(
            f"{label}: the chain head stored with the scope is not the last entry's hash "
            "(entries removed or added outside the ledger)"
        )

    cumulative = np.zeros(len(orders))
    curves_ok = True
    last_after: tuple[float, float] | None = None
    for seq, event_json, eps, dlt, after, *_ in rows:
        try:
            cumulative = cumulative + cached_rdp_curve(event_json, orders, neighbouring)
            expected = epsilon_from_rdp(orders, cumulative, dlt)
            alone = cached_event_epsilon(event_json, orders, neighbouring, dlt)
        except AccountingError as error:
            problems.append(f"{label}: entry {seq}: its event cannot be accounted ({error})")
            curves_ok = False
            continue
        if not _close(after, expected):
            problems.append(
                f"{label}: entry {seq} records epsilon_after={after!r} but the events up to it "
                f"compose to {expected!r}"
            )
        if not _close(eps, alone):
            problems.append(
                f"{label}: entry {seq} records epsilon={eps!r}; its event has epsilon={alone!r}"
            )
        if last_after is not None and last_after[1] == dlt and after < last_after[0] - 1e-12:
            problems.append(f"{label}: entry {seq}: epsilon_after decreases")
        last_after = (after, dlt)
    if curves_ok and not np.allclose(stored, cumulative, rtol=_RTOL, atol=0.0):
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
    if last_after is not None and last_after[1] == delta and not _close(last_after[0], epsilon):
        problems.append(
            f"{label}: the last entry's epsilon_after {last_after[0]!r} is not the scope's "
            f"epsilon {epsilon!r}"
        )
    if not epsilon <= budget + BUDGET_SLACK:
        problems.append(f"{label}: epsilon {epsilon!r} exceeds the budget {budget!r}")
    latest = conn.execute(
        "SELECT epsilon, delta FROM budget_history WHERE scope_id = ? ORDER BY id DESC LIMIT 1",
        (sid,),
    ).fetchone()
    if latest is None or tuple(latest) != (budget, delta):
        problems.append(f"{label}: the budget is not the last one in the budget history")
    return problems
