"""The ledger file: SQLite schema, version check and connection settings.

One SQLite file per budget holder (each site its own, the coordinator its
own), in write-ahead-log mode so readers never block the single writer, with
a busy timeout so concurrent writers queue, and foreign keys on.

Tables
------
meta
    ``application`` and ``schema_version`` (a file without them is not a ledger).
scopes
    One row per scope: identity, neighbouring relation, current budget, the RDP
    orders, the cumulative RDP curve at those orders (float64 little-endian),
    the current RDP epsilon, the number of entries and the hash-chain head.
budget_history
    Every budget set or changed, with the time.
entries
    One row per charge: sequence number, event JSON, the event's own epsilon,
    the cumulative epsilon after it, the caller's note/analysis/task/parameters,
    time, package version and the hash chain.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

from accounting.errors import LedgerCorrupted, LedgerError

SCHEMA_VERSION = 1
APPLICATION = "fedstats.accounting.ledger"

Durability = Literal["full", "normal"]
DURABILITIES: tuple[str, ...] = ("full", "normal")

_DDL = (
    """CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE scopes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        unit TEXT NOT NULL CHECK (unit IN ('patient', 'site')),
        owner TEXT NOT NULL,
        study TEXT NOT NULL,
        neighbouring TEXT NOT NULL CHECK (neighbouring IN ('add_or_remove_one', 'replace_one')),
        budget_epsilon REAL NOT NULL CHECK (budget_epsilon > 0),
        budget_delta REAL NOT NULL CHECK (budget_delta > 0 AND budget_delta < 1),
        orders TEXT NOT NULL,
        rdp BLOB NOT NULL,
        epsilon REAL NOT NULL,
        entries INTEGER NOT NULL DEFAULT 0,
        last_hash TEXT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (unit, owner, study)
    )""",
    """CREATE TABLE budget_history (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        scope_id INTEGER NOT NULL REFERENCES scopes (id),
        epsilon REAL NOT NULL,
        delta REAL NOT NULL,
        changed_at TEXT NOT NULL,
        package_version TEXT NOT NULL
    )""",
    """CREATE TABLE entries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        scope_id INTEGER NOT NULL REFERENCES scopes (id),
        seq INTEGER NOT NULL,
        event_json TEXT NOT NULL,
        epsilon REAL NOT NULL,
        delta REAL NOT NULL,
        epsilon_after REAL NOT NULL,
        note TEXT,
        analysis TEXT,
        task TEXT,
        parameters TEXT NOT NULL,
        created_at TEXT NOT NULL,
        package_version TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        entry_hash TEXT NOT NULL,
        UNIQUE (scope_id, seq)
    )""",
    "CREATE INDEX budget_history_scope ON budget_history (scope_id, id)",
)
TABLES = frozenset({"meta", "scopes", "budget_history", "entries"})


def database_error(path: Path, error: sqlite3.Error, doing: str) -> LedgerError:
    """A typed error naming the ledger file for an SQLite error."""
    name = getattr(error, "sqlite_errorname", "")
    if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or "not a database" in str(error):
        return LedgerCorrupted(
            f"ledger {path} is not a readable SQLite database ({error}) while {doing}; "
            "restore it from a backup or point to the right file"
        )
    return LedgerError(f"ledger {path}: SQLite error while {doing}: {error}")


def connect(path: Path, durability: Durability, timeout: float) -> sqlite3.Connection:
    """Open (creating if absent or empty) the ledger at ``path`` and check its schema.

    ``durability="full"`` (``PRAGMA synchronous=FULL``) fsyncs the write-ahead
    log at every commit and survives power loss; ``"normal"`` survives a
    process crash but may lose the last commits on power loss.

    Raises
    ------
    LedgerCorrupted
        If the file is not an SQLite database or a ledger table is missing.
    LedgerError
        If the file is another application's database, has another schema
        version, or cannot be opened.
    """
    if durability not in DURABILITIES:
        raise LedgerError(f"durability must be one of {DURABILITIES}, got {durability!r}")
    try:
        conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
    except sqlite3.Error as error:
        raise database_error(path, error, "opening") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LedgerError(
                f"ledger {path}: SQLite refused write-ahead-log mode (journal_mode={mode}); "
                "put the ledger on a local file system"
            )
        conn.execute(f"PRAGMA synchronous = {durability.upper()}")
        conn.execute("PRAGMA foreign_keys = ON")
        _initialise_or_check(conn, path)
    except sqlite3.Error as error:
        conn.close()
        raise database_error(path, error, "opening") from None
    except BaseException:
        conn.close()
        raise
    return conn


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {name for (name,) in rows if not name.startswith("sqlite_")}


def _initialise_or_check(conn: sqlite3.Connection, path: Path) -> None:
    if not _tables(conn):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not _tables(conn):  # another process may have created it meanwhile
                for statement in _DDL:
                    conn.execute(statement)
                conn.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    tables = _tables(conn)
    if "meta" not in tables:
        raise LedgerError(
            f"{path} is an SQLite database but not a fedstats privacy ledger "
            f"(tables: {', '.join(sorted(tables))}); refusing to use it"
        )
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("application") != APPLICATION:
        raise LedgerError(
            f"{path} is not a fedstats privacy ledger (application={meta.get('application')!r})"
        )
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise LedgerError(
            f"ledger {path} has schema version {meta.get('schema_version')!r}; this version of "
            f"accounting reads version {SCHEMA_VERSION}. Use the fedstats release that wrote it, "
            "or migrate the file"
        )
    missing = TABLES - tables
    if missing:
        raise LedgerCorrupted(f"ledger {path} lacks table(s) {', '.join(sorted(missing))}")
