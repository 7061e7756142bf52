"""Privacy accounting: units of privacy, accountants and the durable ledger.

Every release is described as a ``dp_accounting`` DpEvent and charged to a
:class:`Ledger` scope *before* it is released. Epsilon always comes from an
accountant, never a hand formula: RDP (dp_accounting's ``RdpAccountant``)
enforces budgets; PLD (``PLDAccountant``) is reported beside it as the
tighter figure. Every budget and charge names its unit of privacy (a patient
for record-level privacy at a site, a site for client-level privacy across a
federation) and its neighbouring relation.

This package imports none of ``fedstats``, ``harmonize`` or ``reports``,
and ``dp_accounting`` only when an epsilon, a curve or an event is first
computed or decoded: that package loads SciPy's signal and stats modules
(about a second), which scopes, budgets, errors and a command's help do not
need.
"""

from accounting.accountants import pld_epsilon, rdp_epsilon
from accounting.calibration import calibrate_gaussian
from accounting.errors import (
    AccountingError,
    BudgetBelowSpent,
    BudgetExceeded,
    InvalidBudget,
    InvalidEntry,
    InvalidScope,
    LedgerCorrupted,
    LedgerError,
    LedgerIntegrityError,
    LedgerRewritten,
    MalformedEvent,
    ScopeConflict,
    UnknownScope,
    UnsupportedMechanism,
)
from accounting.events import describe_event, event_from_json, event_to_json
from accounting.ledger import DEFAULT_DURABILITY, Ledger
from accounting.records import (
    Budget,
    BudgetChange,
    ChainHead,
    Entry,
    Preview,
    Spent,
    VerifyReport,
)
from accounting.scope import Scope
from accounting.units import Neighbouring, PrivacyUnit

__all__ = [
    "DEFAULT_DURABILITY",
    "AccountingError",
    "Budget",
    "BudgetBelowSpent",
    "BudgetChange",
    "BudgetExceeded",
    "ChainHead",
    "Entry",
    "InvalidBudget",
    "InvalidEntry",
    "InvalidScope",
    "Ledger",
    "LedgerCorrupted",
    "LedgerError",
    "LedgerIntegrityError",
    "LedgerRewritten",
    "MalformedEvent",
    "Neighbouring",
    "Preview",
    "PrivacyUnit",
    "Scope",
    "ScopeConflict",
    "Spent",
    "UnknownScope",
    "UnsupportedMechanism",
    "VerifyReport",
    "calibrate_gaussian",
    "describe_event",
    "event_from_json",
    "event_to_json",
    "pld_epsilon",
    "rdp_epsilon",
]
