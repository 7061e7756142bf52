"""Site side of privacy status: the site's budget for a study and whether a plan fits.

Budgets and spending are public facts about the site's ledger, not about
its patients, so this reply aggregates nothing and is not noised.
"""

from __future__ import annotations

from typing import Any

import accounting
from fedstats.contract.tasks.budget import _arguments
from fedstats.errors import MalformedRequestError, NoBudgetError
from fedstats.site.task import SiteContext, TaskReply


def status(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """The site's RDP epsilon spent and budget for the study; whether ``planned`` would fit."""
    study, planned = _arguments(args)
    if ctx.ledger is None:
        raise NoBudgetError(
            site=ctx.name, task=None, study=study, reason="the site keeps no privacy ledger"
        )
    try:
        event = accounting.event_from_json(planned)
    except accounting.MalformedEvent as error:
        raise MalformedRequestError(site=ctx.name, task=None, reason=str(error)) from None
    scope = accounting.Scope(unit="patient", owner=ctx.name, study=study)
    try:
        preview = ctx.ledger.preview(scope, event)
    except accounting.UnknownScope:
        raise NoBudgetError(
            site=ctx.name, task=None, study=study, reason="no privacy budget is set for this study"
        ) from None
    except accounting.UnsupportedMechanism as error:
        raise MalformedRequestError(site=ctx.name, task=None, reason=str(error)) from None
    return TaskReply(
        {
            "epsilon_spent": preview.epsilon_before,
            "budget_epsilon": preview.budget_epsilon,
            "fits": bool(preview.fits),
        },
        contributors=None,
    )
