"""The accounting package's exceptions, all in one place.

Every message names what it is about (the scope, the mechanism, the ledger
file) and says what to do. All derive from :class:`AccountingError`, so a
caller can catch the whole family; argument errors also derive from
:class:`ValueError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accounting.scope import Scope


class AccountingError(Exception):
    """Base class of every error raised by :mod:`accounting`."""


class InvalidScope(AccountingError, ValueError):
    """A scope's unit, owner, study or neighbouring relation is not valid."""


class InvalidBudget(AccountingError, ValueError):
    """A budget (epsilon, delta) is not valid, or would be below what is already spent."""


class BudgetBelowSpent(InvalidBudget):
    """A new budget is below what its scope has already spent; the budget was not changed.

    Attributes
    ----------
    scope:
        The scope whose budget was to change.
    epsilon, delta:
        The budget refused.
    spent:
        RDP epsilon the scope has already spent, stated at the refused ``delta``.
    """

    def __init__(self, *, scope: Scope, epsilon: float, delta: float, spent: float) -> None:
        self.scope = scope
        self.epsilon = epsilon
        self.delta = delta
        self.spent = spent
        super().__init__(
            f"cannot set the budget of {scope} to epsilon={epsilon:.6g} at delta={delta:.3g}: "
            f"it has already spent epsilon={spent:.6g} at that delta. A budget can be lowered "
            "only down to what is spent; the budget was not changed."
        )


class InvalidEntry(AccountingError, ValueError):
    """A charge's note, analysis, task or parameters cannot be recorded."""


class MalformedEvent(AccountingError, ValueError):
    """Text or an object is not a DpEvent this package can encode or decode."""


class UnsupportedMechanism(AccountingError):
    """The accountant cannot account this event: it must not be charged or released.

    Attributes
    ----------
    mechanism:
        Class name of the offending (sub-)event, e.g. ``"SampledWithoutReplacementDpEvent"``.
    accountant:
        ``"RDP"`` or ``"PLD"``.
    reason:
        Why the accountant refuses it.
    """

    def __init__(self, message: str, *, mechanism: str, accountant: str, reason: str) -> None:
        super().__init__(message)
        self.mechanism = mechanism
        self.accountant = accountant
        self.reason = reason


class BudgetExceeded(AccountingError):
    """A charge would take a scope over its epsilon budget; nothing was recorded.

    Attributes
    ----------
    scope:
        The scope charged.
    budget_epsilon:
        The scope's epsilon budget.
    spent:
        RDP epsilon already spent.
    requested:
        RDP epsilon of the refused release on its own.
    would_total:
        RDP epsilon the scope would reach with the release composed in. RDP
        composes order by order, so this is not ``spent + requested``.
    remaining:
        ``budget_epsilon - spent`` unless given.
    delta:
        The scope's delta, at which the epsilons are stated (None if not given).
    mechanism:
        Plain-English description of the refused release (None if not given).
    """

    def __init__(
        self,
        *,
        scope: Scope,
        budget_epsilon: float,
        spent: float,
        requested: float,
        would_total: float,
        remaining: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
    ) -> None:
        self.scope = scope
        self.budget_epsilon = budget_epsilon
        self.spent = spent
        self.requested = requested
        self.would_total = would_total
        self.remaining = budget_epsilon - spent if remaining is None else remaining
        self.delta = delta
        self.mechanism = mechanism
        what = "this release alone" if mechanism is None else f"this release alone ({mechanism})"
        at = "RDP composition" if delta is None else f"RDP composition at delta={delta:.3g}"
        super().__init__(
            f"privacy budget exceeded for {scope}: spent epsilon={spent:.6g}, "
            f"requested epsilon={requested:.6g} for {what}, "
            f"the total would reach epsilon={would_total:.6g} ({at}, not the sum), "
            f"remaining epsilon={self.remaining:.6g} of the budget "
            f"epsilon={budget_epsilon:.6g}. Nothing was recorded and nothing may be "
            "released; add more noise or do fewer releases, or have the privacy officer "
            "raise the budget with Ledger.set_budget if the study's approval allows it."
        )


class LedgerError(AccountingError):
    """A ledger file cannot be used: not a ledger, wrong schema version, scope conflicts, ..."""


class LedgerCorrupted(LedgerError):
    """A ledger file is damaged: SQLite cannot read it or its contents are inconsistent."""


class LedgerIntegrityError(LedgerCorrupted):
    """A scope's stored budget state disagrees with its hash-chained entries: nothing is charged.

    The scope row caches the cumulative RDP curve, epsilon, entry count and
    chain head; the entries are the record. When the cache is not what the
    entries compose to (a hand-reset curve, deleted entries, a rewritten
    head), a charge against the cache could pass a budget that the entries
    have already spent, so the ledger refuses every charge to the scope.

    Attributes
    ----------
    path:
        The ledger file.
    scope:
        The scope refused, or None for a problem of the whole file.
    problems:
        What disagrees, one sentence each.
    """

    def __init__(self, *, path: str, scope: Scope | None, problems: tuple[str, ...]) -> None:
        self.path = path
        self.scope = scope
        self.problems = problems
        what = "the ledger" if scope is None else str(scope)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(
            f"ledger {path}: {what} does not verify, so nothing was charged and nothing may be "
            f"released: {problems[0] if problems else 'state disagrees with its entries'}{more}. "
            "The file was changed outside fedstats (or damaged). Restore it from a backup, "
            "list every problem with Ledger.verify() (fedstats budget show --ledger), and "
            "have the site's privacy officer decide before any further release."
        )


class LedgerRewritten(LedgerIntegrityError):
    """A ledger does not extend a chain head recorded outside it (run records, replies, study
    record): its history was rewritten or replaced since that head was recorded."""


class UnknownScope(LedgerError, LookupError):
    """The ledger holds no budget for this scope."""

    def __init__(self, scope: Scope, path: str) -> None:
        self.scope = scope
        self.path = path
        super().__init__(
            f"no privacy budget for {scope} in ledger {path}; the privacy officer must call "
            "Ledger.set_budget(scope, epsilon=..., delta=...) before anything is charged to it"
        )


class ScopeConflict(LedgerError):
    """A scope exists in the ledger with another neighbouring relation."""
