"""The durable privacy ledger: budgets per scope, and every charge against them.

A charge is an atomic check-and-commit. Under SQLite's write lock (``BEGIN
IMMEDIATE``, so concurrent processes queue) the scope's cumulative RDP curve
is read, the event's curve added to it (RDP composes additively order by
order, Mironov 2017, Prop. 1), the new curve converted to epsilon at the
scope's delta with dp_accounting's ``compute_epsilon``, and the entry is
committed only if that epsilon is within the budget. Nothing is written for a
refused charge, and :meth:`Ledger.charge` returns only after the commit, so a
result may be released once it returns: a crash after the commit leaves the
charge recorded (conservative) and the file consistent.

The scope keeps its cumulative curve, so a charge never recomposes its
history; each event's curve is computed once per process by a fresh
``RdpAccountant`` and cached. The scope's epsilon therefore equals
``dp_accounting.rdp.RdpAccountant()`` composing the same events.

The scope row's cumulative curve, epsilon, entry count and chain head are a
cache of what its hash-chained entries compose to, and a charge trusts the
cache only once it has been recomputed from the entries: at open, every
scope is recomputed (:func:`accounting.verify.check_scope`, the chain from
genesis and the sum of the entries' curves); at each charge, the scope row
must still hold exactly the state this object verified or wrote last, or
the entries added since (by another process) must chain on from it and
compose to the new state. A scope whose cache disagrees with its entries is
refused with :class:`~accounting.errors.LedgerIntegrityError`, so a
hand-reset curve cannot buy a second budget. A ledger rewritten wholesale
and consistently (entries deleted, the scope row reset to genesis) agrees
with itself; it is detected against a chain head recorded outside the file
(:meth:`Ledger.heads`, :meth:`Ledger.rewritten_since`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import math
import numbers
import sqlite3
from collections.abc import Iterator
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accounting import schema
from accounting.accountants import (
    BUDGET_SLACK,
    cached_event_epsilon,
    cached_rdp_curve,
    check_delta,
    default_orders,
    epsilon_from_rdp,
    pld_epsilon,
)
from accounting.chain import canonical_json, chain_hash, entry_content, genesis_hash
from accounting.errors import (
    BudgetBelowSpent,
    BudgetExceeded,
    InvalidBudget,
    InvalidEntry,
    LedgerCorrupted,
    LedgerError,
    LedgerIntegrityError,
    LedgerRewritten,
    ScopeConflict,
    UnknownScope,
    UnsupportedMechanism,
)
from accounting.events import describe_event, event_from_json, event_to_json
from accounting.records import (
    Budget,
    BudgetChange,
    ChainHead,
    Entry,
    Preview,
    Spent,
    VerifyReport,
)
from accounting.schema import Durability
from accounting.scope import Scope
from accounting.verify import (
    ENTRY_QUERY,
    SCOPE_QUERY,
    ChainWalk,
    budget_history_problems,
    check_scope,
    deleted_entries,
    scope_label,
    verify_ledger,
    walk_chain,
)

if TYPE_CHECKING:
    import dp_accounting

#: Durability of a ledger opened without ``durability=`` (see :class:`Ledger`).
DEFAULT_DURABILITY: Durability = "full"

_SCOPE_COLUMNS = (
    "id, neighbouring, budget_epsilon, budget_delta, orders, rdp, epsilon, entries, last_hash"
)
_ENTRY_COLUMNS = (
    "id, seq, event_json, epsilon, delta, epsilon_after, note, analysis, task, parameters, "
    "created_at, package_version, prev_hash, entry_hash"
)


@functools.cache
def package_version() -> str:
    """Installed ``fedstats`` version, recorded with each entry; ``"unknown"`` if not installed."""
    try:
        return importlib.metadata.version("fedstats")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


@functools.lru_cache(maxsize=1024)
def _orders(orders_json: str) -> tuple[float, ...]:
    return tuple(float(order) for order in json.loads(orders_json))


@functools.lru_cache(maxsize=4096)
def _decoded(event_json: str) -> dp_accounting.DpEvent:
    return event_from_json(event_json)


def _check_text(name: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidEntry(f"{name} must be a string or None, got {type(value).__name__}")
    return value


def _jsonable(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _parameters_json(parameters: object) -> str:
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict) or not all(isinstance(k, str) for k in parameters):
        raise InvalidEntry("parameters must be a dict with string keys")
    try:
        return json.dumps(
            parameters, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_jsonable
        )
    except (TypeError, ValueError) as error:
        raise InvalidEntry(
            f"parameters must hold JSON values (str, finite numbers, bool, None, lists, dicts): "
            f"{error}"
        ) from None


def _check_epsilon(epsilon: object) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise InvalidBudget(f"epsilon must be a number, got {epsilon!r}")
    if not (float(epsilon) > 0 and math.isfinite(epsilon)):
        raise InvalidBudget(f"epsilon must be positive and finite, got {epsilon!r}")
    return float(epsilon)


def _entry(scope: Scope, row: tuple[Any, ...], event: dp_accounting.DpEvent | None = None) -> Entry:
    """An :class:`Entry` from an ``entries`` row in ``_ENTRY_COLUMNS`` order."""
    (eid, seq, event_json, epsilon, delta, epsilon_after, note, analysis, task) = row[:9]
    parameters, created_at, version, prev_hash, entry_hash = row[9:]
    return Entry(
        id=eid,
        seq=seq,
        scope=scope,
        event=_decoded(event_json) if event is None else event,
        event_json=event_json,
        epsilon_after=epsilon_after,
        note=note,
        analysis=analysis,
        task=task,
        parameters=json.loads(parameters),
        created_at=datetime.datetime.fromisoformat(created_at),
        package_version=version,
        entry_hash=entry_hash,
        prev_hash=prev_hash,
        epsilon=epsilon,
        delta=delta,
    )


class _ScopeRow:
    """A scope's row as read inside a transaction."""

    __slots__ = ("budget", "delta", "entries", "epsilon", "id", "last_hash", "orders", "rdp")

    def __init__(self, row: tuple[Any, ...], scope: Scope, path: Path) -> None:
        sid, neighbouring, budget, delta, orders_json, rdp, epsilon, entries, last_hash = row
        if neighbouring != scope.neighbouring:
            raise ScopeConflict(
                f"ledger {path} holds unit={scope.unit}, owner={scope.owner}, "
                f"study={scope.study} under neighbouring={neighbouring}, not "
                f"{scope.neighbouring}; a scope's relation is fixed when its budget is first set"
            )
        self.id: int = sid
        self.budget: float = budget
        self.delta: float = delta
        try:
            self.orders = _orders(orders_json)
            self.rdp = np.frombuffer(rdp, dtype="<f8")
        except (TypeError, ValueError) as error:
            raise LedgerCorrupted(f"ledger {path}: {scope} has an unreadable RDP curve") from error
        if len(self.rdp) != len(self.orders):
            raise LedgerCorrupted(
                f"ledger {path}: {scope} has {len(self.rdp)} RDP values for "
                f"{len(self.orders)} orders; run Ledger.verify()"
            )
        self.epsilon: float = epsilon
        self.entries: int = entries
        self.last_hash: str = last_hash


@dataclasses.dataclass
class _Verified:
    """A scope's state as last recomputed from its entries (or written by this object)."""

    entries: int
    head: str
    rdp: np.ndarray
    epsilon: float
    budget: tuple[float, float]
    problems: tuple[str, ...]


class Ledger:
    """A site's or the coordinator's privacy ledger in one SQLite file.

    Parameters
    ----------
    path:
        The ledger file; created if absent (its directory must exist).
    durability:
        ``"full"`` (the default): ``PRAGMA synchronous=FULL``, the write-ahead
        log is fsynced at every commit, so a committed charge survives power
        loss as well as a killed process. ``"normal"``: ``synchronous=NORMAL``,
        a committed charge survives the process being killed (SIGKILL) but the
        last commits may be lost on power loss or an OS crash, after their
        results may have been released. ``benchmarks/ledger.py`` measures both
        on a scope holding 10,000 entries: about 2,200 charges/s with
        ``"full"`` and 4,600 with ``"normal"`` on a 2-core machine, so the
        default is ``"full"``, which meets the target of 1,000 charges/s.
        Opening the file recomputes every scope from its entries (about
        0.3 s for 10,000 entries); the check before each charge compares the
        scope row with that verified state and costs no measurable rate.
    timeout:
        Seconds to wait for another process's write lock before failing.

    Notes
    -----
    One :class:`Ledger` per thread (SQLite connections are not shared across
    threads); any number of processes may open the same file. Usable as a
    context manager, which closes it.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        durability: Durability = DEFAULT_DURABILITY,
        timeout: float = 30.0,
    ) -> None:
        self._path = Path(path)
        self._durability: Durability = durability
        self._conn: sqlite3.Connection | None = schema.connect(self._path, durability, timeout)
        self._scope_orders: dict[Scope, tuple[float, ...]] = {}
        self._verified: dict[int, _Verified] = {}
        self._file_problems: tuple[str, ...] = ()
        try:
            self._verify_at_open()
        except BaseException:
            self.close()
            raise

    # -- life cycle ---------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def durability(self) -> Durability:
        return self._durability

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else self._durability
        return f"Ledger({str(self._path)!r}, {state})"

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LedgerError(f"ledger {self._path} is closed")
        return self._conn

    @contextlib.contextmanager
    def _transaction(self, mode: str, doing: str) -> Iterator[sqlite3.Connection]:
        """``BEGIN <mode>`` ... ``COMMIT``; ROLLBACK on any exception."""
        conn = self._db()
        try:
            conn.execute(f"BEGIN {mode}")
        except sqlite3.Error as error:
            raise schema.database_error(self._path, error, doing) from None
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as error:
            if conn.in_transaction:
                conn.rollback()
            if isinstance(error, sqlite3.Error):
                raise schema.database_error(self._path, error, doing) from None
            raise

    def _scope_row(self, conn: sqlite3.Connection, scope: Scope) -> _ScopeRow:
        if not isinstance(scope, Scope):
            raise TypeError(f"expected an accounting.Scope, got {type(scope).__name__}")
        row = conn.execute(
            f"SELECT {_SCOPE_COLUMNS} FROM scopes WHERE unit = ? AND owner = ? AND study = ?",
            (scope.unit, scope.owner, scope.study),
        ).fetchone()
        if row is None:
            raise UnknownScope(scope, str(self._path))
        return _ScopeRow(row, scope, self._path)

    # -- integrity ----------------------------------------------------------

    def _verify_at_open(self) -> None:
        """Recompute every scope from its entries (see the module docstring)."""
        with self._transaction("DEFERRED", "verifying at open") as conn:
            self._file_problems = tuple(deleted_entries(conn, self._path))
            for row in conn.execute(SCOPE_QUERY).fetchall():
                self._verify_scope(conn, row)

    def _verify_scope(self, conn: sqlite3.Connection, row: tuple[Any, ...]) -> _Verified:
        check = check_scope(conn, row, entry_epsilons=False)
        walk = check.walk or ChainWalk(-1, "", np.zeros(0))
        verified = _Verified(
            entries=walk.entries,
            head=walk.head,
            rdp=np.frombuffer(row[8], dtype="<f8").copy() if not check.problems else walk.rdp,
            epsilon=row[9],
            budget=(row[5], row[6]),
            problems=tuple(check.problems),
        )
        self._verified[row[0]] = verified
        return verified

    def integrity_problems(self) -> dict[Scope, tuple[str, ...]]:
        """Each scope's disagreements between its stored state and its entries, as found at
        open and at each charge since (empty tuples when none); problems of the whole file
        are listed under every scope."""
        with self._transaction("DEFERRED", "reading scopes") as conn:
            rows = conn.execute(f"{SCOPE_QUERY} ORDER BY id").fetchall()
            out = {}
            for row in rows:
                verified = self._verified.get(row[0]) or self._verify_scope(conn, row)
                out[Scope(*row[1:5])] = self._file_problems + verified.problems
        return out

    def _checked(self, conn: sqlite3.Connection, scope: Scope, row: _ScopeRow) -> _Verified:
        """The scope's verified state, after checking that its row still agrees with it.

        Cheap when nothing changed since this object last verified or wrote
        the scope (compare the head, count, curve bytes, epsilon and budget);
        entries another process added are walked from the verified head.

        Raises
        ------
        LedgerIntegrityError
            If the stored state disagrees with the scope's entries.
        """
        verified = self._verified.get(row.id)
        if verified is None:  # created after open (here or by another process)
            raw = conn.execute(f"{SCOPE_QUERY} WHERE id = ?", (row.id,)).fetchone()
            verified = self._verify_scope(conn, raw)
        label = scope_label(scope.unit, scope.owner, scope.study)
        problems = list(self._file_problems + verified.problems)
        if not problems and (row.entries, row.last_hash) != (verified.entries, verified.head):
            if row.entries < verified.entries:
                problems.append(
                    f"{label}: it counts {row.entries} entries, fewer than the {verified.entries} "
                    "verified before (entries removed outside the ledger)"
                )
            else:
                rows = conn.execute(ENTRY_QUERY, (row.id, verified.entries)).fetchall()
                start = ChainWalk(verified.entries, verified.head, verified.rdp)
                walk = walk_chain(label, scope, row.orders, rows, start, entry_epsilons=False)
                problems += walk.problems
                if (walk.entries, walk.head) != (row.entries, row.last_hash):
                    problems.append(
                        f"{label}: the chain head and count stored with the scope are not its "
                        "last entry's (entries removed or added outside the ledger)"
                    )
                elif not np.allclose(row.rdp, walk.rdp, rtol=1e-9, atol=0.0):
                    problems.append(
                        f"{label}: the stored cumulative RDP curve is not the sum of its "
                        "entries' curves"
                    )
                if not problems:
                    verified.entries, verified.head = walk.entries, walk.head
                    verified.rdp = row.rdp.copy()
        elif not problems and not np.array_equal(row.rdp, verified.rdp):
            problems.append(
                f"{label}: the stored cumulative RDP curve changed without a charge (it is not "
                "the sum of its entries' curves)"
            )
        if not problems and (row.budget, row.delta) != verified.budget:
            problems += budget_history_problems(conn, label, row.id, row.budget, row.delta)
            if not problems:
                verified.budget = (row.budget, row.delta)
                verified.epsilon = math.nan  # recomputed below at the new delta
        if not problems and row.epsilon != verified.epsilon:
            current = epsilon_from_rdp(row.orders, row.rdp, row.delta) if row.entries else 0.0
            if not math.isclose(current, row.epsilon, rel_tol=1e-9, abs_tol=1e-12):
                problems.append(
                    f"{label}: stored epsilon {row.epsilon!r} differs from its RDP curve's "
                    f"{current!r}"
                )
            else:
                verified.epsilon = row.epsilon
        if problems:
            verified.problems = tuple(p for p in problems if p not in self._file_problems)
            raise LedgerIntegrityError(path=str(self._path), scope=scope, problems=tuple(problems))
        return verified

    def heads(self) -> list[ChainHead]:
        """Every scope's stored chain head and entry count, to record outside the ledger."""
        with self._transaction("DEFERRED", "reading chain heads") as conn:
            rows = conn.execute(
                "SELECT unit, owner, study, neighbouring, entries, last_hash FROM scopes "
                "ORDER BY id"
            ).fetchall()
        return [ChainHead(Scope(*row[:4]), row[4], row[5]) for row in rows]

    def rewritten_since(self, recorded: ChainHead) -> str | None:
        """Why this ledger does not extend ``recorded``, or None when it does.

        It extends the head when the scope exists under the same relation,
        holds at least ``recorded.entries`` entries, and its entry number
        ``recorded.entries`` has hash ``recorded.head`` (for 0 entries: the
        recorded head is the scope's genesis hash). Since each entry's hash
        commits to the one before (:mod:`accounting.chain`), the history up
        to the recorded head is then the one recorded, provided the chain
        itself verifies (:meth:`integrity_problems`).
        """
        scope = recorded.scope
        label = scope_label(scope.unit, scope.owner, scope.study)
        with self._transaction("DEFERRED", "comparing a chain head") as conn:
            row = conn.execute(
                "SELECT id, neighbouring, entries FROM scopes WHERE unit = ? AND owner = ? "
                "AND study = ?",
                (scope.unit, scope.owner, scope.study),
            ).fetchone()
            found = (
                None
                if row is None or recorded.entries == 0
                else conn.execute(
                    "SELECT entry_hash FROM entries WHERE scope_id = ? AND seq = ?",
                    (row[0], recorded.entries),
                ).fetchone()
            )
        if row is None:
            return f"{label} is missing, but a head with {recorded.entries} entries was recorded"
        if row[1] != scope.neighbouring:
            return f"{label} is held under neighbouring={row[1]}, not {scope.neighbouring}"
        if row[2] < recorded.entries:
            return (
                f"{label} holds {row[2]} entries, fewer than the {recorded.entries} recorded "
                "with its chain head: charges were removed"
            )
        expected = genesis_hash(scope) if recorded.entries == 0 else (found or ("",))[0]
        if expected != recorded.head:
            return (
                f"{label}: its entry {recorded.entries} does not have the recorded hash "
                f"{recorded.head[:16]}...: the history up to it was rewritten"
            )
        return None

    def check_extends(self, recorded: list[ChainHead], *, where: str) -> None:
        """Raise :class:`LedgerRewritten` unless this ledger extends every recorded head.

        ``where`` says where the heads were recorded (for the message).
        """
        problems = tuple(
            f"{problem} (head recorded in {where})"
            for head in recorded
            if (problem := self.rewritten_since(head)) is not None
        )
        if problems:
            raise LedgerRewritten(path=str(self._path), scope=None, problems=problems)

    def refuse(self, scope: Scope, problem: str) -> None:
        """Refuse every later charge to ``scope`` through this object, for ``problem``.

        For a check made outside the file (:meth:`check_extends` against heads
        recorded elsewhere): the scope is then refused as one whose row
        disagrees with its entries is (:class:`LedgerIntegrityError`), so a
        caller that goes on answering cannot spend its budget again.
        """
        with self._transaction("DEFERRED", "refusing a scope") as conn:
            raw = conn.execute(
                f"{SCOPE_QUERY} WHERE unit = ? AND owner = ? AND study = ?",
                (scope.unit, scope.owner, scope.study),
            ).fetchone()
            if raw is None:
                raise UnknownScope(scope, str(self._path))
            verified = self._verified.get(raw[0]) or self._verify_scope(conn, raw)
            verified.problems += (problem,)

    # -- budgets ------------------------------------------------------------

    def set_budget(self, scope: Scope, epsilon: float, delta: float) -> Budget:
        """Create ``scope`` with this budget, or change its budget.

        Every change is recorded in the budget history with its time. The
        scope's neighbouring relation is fixed at creation.

        Raises
        ------
        InvalidBudget
            For epsilon <= 0 or not finite, or delta outside (0, 1).
        BudgetBelowSpent
            (an :class:`InvalidBudget`) for a budget below what the scope has
            already spent at the new delta; its ``spent`` says how much.
        ScopeConflict
            If the scope exists under another neighbouring relation.
        """
        epsilon = _check_epsilon(epsilon)
        delta = check_delta(delta)
        now = _now()
        with self._transaction("IMMEDIATE", "setting a budget") as conn:
            try:
                row = self._scope_row(conn, scope)
            except UnknownScope:
                orders = canonical_json(list(default_orders()))
                cursor = conn.execute(
                    "INSERT INTO scopes (unit, owner, study, neighbouring, budget_epsilon, "
                    "budget_delta, orders, rdp, epsilon, entries, last_hash, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0.0, 0, ?, ?)",
                    (
                        scope.unit,
                        scope.owner,
                        scope.study,
                        scope.neighbouring,
                        epsilon,
                        delta,
                        orders,
                        np.zeros(len(default_orders()), dtype="<f8").tobytes(),
                        genesis_hash(scope),
                        now,
                    ),
                )
                scope_id = cursor.lastrowid
            else:
                self._checked(conn, scope, row)
                if (row.budget, row.delta) == (epsilon, delta):
                    return Budget(epsilon, delta)
                spent = epsilon_from_rdp(row.orders, row.rdp, delta) if row.entries else 0.0
                if spent > epsilon + BUDGET_SLACK:
                    raise BudgetBelowSpent(scope=scope, epsilon=epsilon, delta=delta, spent=spent)
                conn.execute(
                    "UPDATE scopes SET budget_epsilon = ?, budget_delta = ?, epsilon = ? "
                    "WHERE id = ?",
                    (epsilon, delta, spent, row.id),
                )
                scope_id = row.id
            conn.execute(
                "INSERT INTO budget_history (scope_id, epsilon, delta, changed_at, "
                "package_version) VALUES (?, ?, ?, ?, ?)",
                (scope_id, epsilon, delta, now, package_version()),
            )
        return Budget(epsilon, delta)

    def budget(self, scope: Scope) -> Budget:
        """The scope's current budget; :class:`UnknownScope` if none was set."""
        with self._transaction("DEFERRED", "reading a budget") as conn:
            row = self._scope_row(conn, scope)
        return Budget(row.budget, row.delta)

    def budget_history(self, scope: Scope) -> list[BudgetChange]:
        """Every budget set for ``scope``, oldest first (a change to the same budget adds none)."""
        with self._transaction("DEFERRED", "reading a budget history") as conn:
            row = self._scope_row(conn, scope)
            rows = conn.execute(
                "SELECT epsilon, delta, changed_at, package_version FROM budget_history "
                "WHERE scope_id = ? ORDER BY id",
                (row.id,),
            ).fetchall()
        return [
            BudgetChange(epsilon, delta, datetime.datetime.fromisoformat(changed_at), version)
            for epsilon, delta, changed_at, version in rows
        ]

    def scopes(self) -> list[Scope]:
        """Every scope in the ledger, in order of creation."""
        with self._transaction("DEFERRED", "listing scopes") as conn:
            rows = conn.execute(
                "SELECT unit, owner, study, neighbouring FROM scopes ORDER BY id"
            ).fetchall()
        return [Scope(*row) for row in rows]

    # -- charging -----------------------------------------------------------

    def _event_curve(self, scope: Scope, event_json: str) -> tuple[tuple[float, ...], np.ndarray]:
        """The scope's RDP orders and the event's curve at them (before any lock)."""
        orders = self._scope_orders.get(scope)
        if orders is None:
            with self._transaction("DEFERRED", "reading a scope") as conn:
                orders = self._scope_row(conn, scope).orders
            self._scope_orders[scope] = orders
        return orders, cached_rdp_curve(event_json, orders, scope.neighbouring)

    def charge(
        self,
        scope: Scope,
        event: dp_accounting.DpEvent,
        *,
        note: str | None = None,
        analysis: str | None = None,
        task: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> Entry:
        """Record ``event`` against ``scope``'s budget, or refuse it and record nothing.

        Returns only after the entry is committed; release the result it pays
        for after that, never before.

        Parameters
        ----------
        scope:
            Whose budget pays.
        event:
            The release, as a dp_accounting DpEvent.
        note, analysis, task, parameters:
            What the release is, for the report (``parameters`` must be JSON values).

        Raises
        ------
        BudgetExceeded
            If the scope's RDP epsilon would exceed its budget.
        UnsupportedMechanism
            If the RDP accountant cannot account the event under the scope's relation.
        UnknownScope
            If no budget was set for the scope.
        MalformedEvent, InvalidEntry
            For an event this package cannot store, or bad note/parameters.
        """
        for name, value in (("note", note), ("analysis", analysis), ("task", task)):
            _check_text(name, value)
        parameters_json = _parameters_json(parameters)
        event_json = event_to_json(event)
        orders, curve = self._event_curve(scope, event_json)
        version = package_version()
        with self._transaction("IMMEDIATE", "charging") as conn:
            row = self._scope_row(conn, scope)
            verified = self._checked(conn, scope, row)
            cumulative = row.rdp + curve
            epsilon_after = epsilon_from_rdp(orders, cumulative, row.delta)
            requested = cached_event_epsilon(event_json, orders, scope.neighbouring, row.delta)
            if not epsilon_after <= row.budget + BUDGET_SLACK:
                raise BudgetExceeded(
                    scope=scope,
                    budget_epsilon=row.budget,
                    delta=row.delta,
                    spent=row.epsilon,
                    requested=requested,
                    would_total=epsilon_after,
                    mechanism=describe_event(event),
                )
            seq = row.entries + 1
            created_at = _now()
            content = entry_content(
                scope=scope,
                seq=seq,
                event_json=event_json,
                epsilon=requested,
                delta=row.delta,
                epsilon_after=epsilon_after,
                note=note,
                analysis=analysis,
                task=task,
                parameters_json=parameters_json,
                created_at=created_at,
                package_version=version,
            )
            entry_hash = chain_hash(row.last_hash, content)
            values = (
                seq,
                event_json,
                requested,
                row.delta,
                epsilon_after,
                note,
                analysis,
                task,
                parameters_json,
                created_at,
                version,
                row.last_hash,
                entry_hash,
            )
            cursor = conn.execute(
                f"INSERT INTO entries (scope_id, {_ENTRY_COLUMNS.removeprefix('id, ')}) "
                f"VALUES (?{', ?' * len(values)})",
                (row.id, *values),
            )
            conn.execute(
                "UPDATE scopes SET rdp = ?, epsilon = ?, entries = ?, last_hash = ? WHERE id = ?",
                (cumulative.astype("<f8").tobytes(), epsilon_after, seq, entry_hash, row.id),
            )
        # committed: only now may the caller release what this charge pays for
        verified.entries, verified.head, verified.rdp = seq, entry_hash, cumulative
        verified.epsilon = epsilon_after
        return _entry(scope, (cursor.lastrowid, *values), event)

    def preview(self, scope: Scope, event: dp_accounting.DpEvent) -> Preview:
        """What :meth:`charge` would do with ``event`` now; writes nothing.

        Raises the same :class:`UnsupportedMechanism` / :class:`UnknownScope` as a charge.
        """
        event_json = event_to_json(event)
        orders, curve = self._event_curve(scope, event_json)
        with self._transaction("DEFERRED", "previewing a charge") as conn:
            row = self._scope_row(conn, scope)
        epsilon_after = epsilon_from_rdp(orders, row.rdp + curve, row.delta)
        return Preview(
            epsilon_before=row.epsilon,
            epsilon_after=epsilon_after,
            budget_epsilon=row.budget,
            fits=epsilon_after <= row.budget + BUDGET_SLACK,
            epsilon_event=cached_event_epsilon(event_json, orders, scope.neighbouring, row.delta),
            delta=row.delta,
        )

    # -- reading ------------------------------------------------------------

    def spent(self, scope: Scope, *, pld: bool = True) -> Spent:
        """The scope's RDP epsilon (enforced) and PLD epsilon (reported beside it).

        The PLD figure composes the scope's events with dp_accounting's
        ``PLDAccountant``, identical events grouped into one
        ``SelfComposedDpEvent`` each. It can take minutes for many events of
        small noise; ``pld=False`` skips it (``epsilon_pld`` is ``None``, with
        a note) for callers that need only the enforced RDP figures.
        """
        with self._transaction("DEFERRED", "reading spending") as conn:
            row = self._scope_row(conn, scope)
            groups = (
                conn.execute(
                    "SELECT event_json, COUNT(*) FROM entries WHERE scope_id = ? "
                    "GROUP BY event_json ORDER BY MIN(seq)",
                    (row.id,),
                ).fetchall()
                if pld
                else []
            )
        epsilon_pld: float | None = 0.0
        note = None
        if not pld:
            epsilon_pld, note = None, "PLD accountant: not computed (pld=False)"
        elif groups:
            from dp_accounting import SelfComposedDpEvent

            events = [SelfComposedDpEvent(_decoded(text), count) for text, count in groups]
            try:
                epsilon_pld = pld_epsilon(events, row.delta, scope.neighbouring)
            except UnsupportedMechanism as error:
                epsilon_pld, note = None, f"PLD accountant: {error.reason}"
        return Spent(
            epsilon=row.epsilon,
            epsilon_pld=epsilon_pld,
            delta=row.delta,
            remaining=row.budget - row.epsilon,
            entries=row.entries,
            budget_epsilon=row.budget,
            pld_note=note,
        )

    def entries(self, scope: Scope) -> list[Entry]:
        """The scope's entries, oldest first."""
        with self._transaction("DEFERRED", "reading entries") as conn:
            row = self._scope_row(conn, scope)
            rows = conn.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE scope_id = ? ORDER BY seq",
                (row.id,),
            ).fetchall()
        return [_entry(scope, entry) for entry in rows]

    def verify(self) -> VerifyReport:
        """Check the file and every scope; see :func:`accounting.verify.verify_ledger`."""
        with self._transaction("DEFERRED", "verifying") as conn:
            return verify_ledger(conn, self._path)
