"""What a ledger returns: budgets, entries, previews, spending and verification reports.

All are frozen values; epsilons are RDP epsilons at the scope's delta unless
the field says otherwise (``Spent.epsilon_pld``).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING, Any

from accounting.scope import Scope

if TYPE_CHECKING:
    import dp_accounting


@dataclasses.dataclass(frozen=True)
class Budget:
    """A scope's (epsilon, delta) budget."""

    epsilon: float
    delta: float


@dataclasses.dataclass(frozen=True)
class BudgetChange:
    """One setting of a scope's budget, as recorded in the ledger's budget history."""

    epsilon: float
    delta: float
    changed_at: datetime.datetime
    package_version: str


@dataclasses.dataclass(frozen=True)
class Entry:
    """One committed charge.

    Attributes
    ----------
    id:
        Row id in the ledger file, unique and never reused.
    seq:
        1, 2, ... within the scope.
    event, event_json:
        The mechanism charged, and its canonical JSON as stored.
    epsilon_after:
        RDP epsilon of the scope after this charge (cumulative), at ``delta``.
    note, analysis, task, parameters:
        What the caller said the release was.
    created_at:
        Commit time, UTC.
    package_version:
        ``fedstats`` version that wrote the entry.
    entry_hash, prev_hash:
        sha256 hash chain: ``entry_hash = sha256(prev_hash || canonical content)``.
    epsilon:
        RDP epsilon of this event alone, at ``delta``.
    delta:
        The scope's delta when the charge was made.
    """

    id: int
    seq: int
    scope: Scope
    event: dp_accounting.DpEvent
    event_json: str
    epsilon_after: float
    note: str | None
    analysis: str | None
    task: str | None
    parameters: dict[str, Any]
    created_at: datetime.datetime
    package_version: str
    entry_hash: str
    prev_hash: str
    epsilon: float
    delta: float


@dataclasses.dataclass(frozen=True)
class Preview:
    """What a charge would do, without doing it.

    ``epsilon_event`` is the event's RDP epsilon alone; ``fits`` is whether
    ``epsilon_after`` is within ``budget_epsilon``.
    """

    epsilon_before: float
    epsilon_after: float
    budget_epsilon: float
    fits: bool
    epsilon_event: float
    delta: float


@dataclasses.dataclass(frozen=True)
class Spent:
    """A scope's spending.

    ``epsilon`` is the RDP figure that enforces the budget; ``epsilon_pld`` the
    tighter PLD figure of the same events (None, with the reason in
    ``pld_note``, if the PLD accountant cannot account one of them);
    ``remaining = budget_epsilon - epsilon``.
    """

    epsilon: float
    epsilon_pld: float | None
    delta: float
    remaining: float
    entries: int
    budget_epsilon: float
    pld_note: str | None = None


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """Result of :meth:`accounting.Ledger.verify`: ``ok`` or readable ``problems``."""

    ok: bool
    problems: list[str]
    scopes: int
    entries: int

    def __str__(self) -> str:
        state = "ok" if self.ok else "NOT ok"
        head = f"ledger {state}: {self.scopes} scopes, {self.entries} entries"
        return "\n".join([head, *(f"- {problem}" for problem in self.problems)])


@dataclasses.dataclass(frozen=True)
class ChainHead:
    """A scope's hash-chain head and entry count, as recorded outside the ledger file.

    A hash chain (Haber & Stornetta 1991) makes each head commit to every
    entry before it, so a ledger *extends* a recorded head when its entry
    number ``entries`` has hash ``head`` (for ``entries == 0``, the scope's
    genesis hash): the history up to that head is then unchanged. A site
    writes its heads into its run records and private replies, the
    coordinator into its study record; a ledger rewritten wholesale (entries
    deleted, the scope row reset to genesis) no longer extends them.
    """

    scope: Scope
    entries: int
    head: str

    def to_record(self) -> dict[str, Any]:
        """Plain JSON values: the scope's identity, ``entries`` and ``head``."""
        return {
            "unit": self.scope.unit,
            "owner": self.scope.owner,
            "study": self.scope.study,
            "neighbouring": self.scope.neighbouring,
            "entries": self.entries,
            "head": self.head,
        }

    @classmethod
    def from_record(cls, record: object) -> ChainHead:
        """The head a :meth:`to_record` value describes; ``ValueError`` if it is not one."""
        if not isinstance(record, dict):
            raise ValueError(f"a chain head record is a mapping, got {type(record).__name__}")
        entries, head = record.get("entries"), record.get("head")
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 0:
            raise ValueError(f"a chain head's entries is a count, got {entries!r}")
        if not (isinstance(head, str) and len(head) == 64):
            raise ValueError(f"a chain head's head is a sha256 hex digest, got {head!r}")
        scope = Scope(
            str(record.get("unit")),
            str(record.get("owner")),
            str(record.get("study")),
            str(record.get("neighbouring", "add_or_remove_one")),
        )
        return cls(scope, entries, head)
