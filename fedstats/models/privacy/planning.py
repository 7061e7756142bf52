"""Planning a private fit's spending before anything is sent: the coordinator's scope and
ledger, and previews of the sites' and the coordinator's budgets (refused over budget)."""

from __future__ import annotations

from typing import Any

import dp_accounting

import accounting
from fedstats.errors import PlannedBudgetError, StudyConfigurationError

COORDINATOR = "coordinator"
"""The owner of the coordinator's client-level scope in its ledger."""


def coordinator_scope(study: str) -> accounting.Scope:
    """The coordinator's client-level privacy scope of ``study`` (unit: one site)."""
    return accounting.Scope(unit="site", owner=COORDINATOR, study=study)


def coordinator_ledger(federation: Any) -> accounting.Ledger:
    """The federation's coordinator ledger, which client-level privacy needs."""
    if federation.ledger is None:
        raise StudyConfigurationError(
            "client-level privacy needs a coordinator ledger: Federation(..., ledger=Ledger(path))"
        )
    return federation.ledger


def preview_coordinator_budget(
    federation: Any, planned: dp_accounting.DpEvent, what: str, remedy: str
) -> None:
    """Refuse, before anything is sent or charged, a ``planned`` client-level release sequence
    the coordinator's budget cannot pay for (:class:`~fedstats.errors.PlannedBudgetError`,
    naming the budget, what is spent and what the plan would bring it to)."""
    preview = coordinator_ledger(federation).preview(coordinator_scope(federation.study), planned)
    if not preview.fits:
        raise PlannedBudgetError(
            f"the planned {what} (epsilon {preview.epsilon_event:.4g} on its own) would take the "
            f"coordinator's client-level budget for study {federation.study!r} from epsilon "
            f"{preview.epsilon_before:.4g} to {preview.epsilon_after:.4g}, over its budget of "
            f"{preview.budget_epsilon:.4g} at delta {preview.delta:g}; nothing was charged or "
            f"released. {remedy}"
        )


def preview_site_budgets(
    federation: Any,
    planned: dp_accounting.DpEvent,
    analysis: str,
    *,
    what: str = "fit",
    sites: list[str] | None = None,
) -> None:
    """Ask every site whether the whole planned ``what`` fits its budget, before any charge.

    Raises :class:`~fedstats.errors.PlannedBudgetError` naming each site that
    could not pay, with its spent and budgeted epsilon; the only messages
    exchanged are the ``privacy.status`` requests, which release nothing
    about patients.
    """
    replies = federation.request(
        "privacy.status",
        {"study": federation.study, "planned": accounting.event_to_json(planned)},
        analysis=analysis,
        sites=sites,
    )
    short = {s: r for s, r in replies.items() if not r["fits"]}
    if short:
        detail = "; ".join(
            f"{s}: spent {r['epsilon_spent']:.4g} of {r['budget_epsilon']:.4g}"
            for s, r in short.items()
        )
        raise PlannedBudgetError(
            f"the planned {what} would exceed the privacy budget of {sorted(short)} ({detail}); "
            "nothing was charged or released. Lower the rounds or epsilon, or ask the sites."
        )
