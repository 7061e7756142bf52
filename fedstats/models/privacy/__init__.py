"""Privacy at the coordinator's side of a fit, in three parts.

* :mod:`~fedstats.models.privacy.options` — what a fit asks for:
  :class:`RecordDP` (record-level, enforced by every site on its own
  patients) and :class:`ClientDP` (client-level, enforced by the coordinator);
* :mod:`~fedstats.models.privacy.planning` — before anything is sent: the
  coordinator's scope and ledger, and previews that refuse a plan the sites'
  or the coordinator's budgets cannot pay for;
* :mod:`~fedstats.models.privacy.spending` — what a private fit spent, per
  scope, as its results report it (:class:`PrivacyAccount`).
"""

from fedstats.models.privacy.options import (
    WEIGHTS,
    ClientDP,
    RecordDP,
    Release,
    information_rounds,
    privacy_levels,
)
from fedstats.models.privacy.planning import (
    COORDINATOR,
    coordinator_ledger,
    coordinator_scope,
    preview_coordinator_budget,
    preview_site_budgets,
)
from fedstats.models.privacy.spending import (
    PrivacyAccount,
    ScopeSpending,
    coordinator_spending,
    fit_epsilon,
    site_spending,
)

__all__ = [
    "COORDINATOR",
    "WEIGHTS",
    "ClientDP",
    "PrivacyAccount",
    "RecordDP",
    "Release",
    "ScopeSpending",
    "coordinator_ledger",
    "coordinator_scope",
    "coordinator_spending",
    "fit_epsilon",
    "information_rounds",
    "preview_coordinator_budget",
    "preview_site_budgets",
    "privacy_levels",
    "site_spending",
]
