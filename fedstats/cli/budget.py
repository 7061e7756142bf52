"""``fedstats budget show`` and ``budget set``: the budgets of a ledger, for its privacy officer.

Budgets are set and read through :class:`accounting.Ledger` only: a change is
committed to the ledger file (SQLite, fsynced) with its time in the ledger's
budget history, and a budget below what a scope already spent is refused
(:class:`accounting.BudgetBelowSpent`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedstats.cli.logs import fail

if TYPE_CHECKING:
    import accounting

budget_app = typer.Typer(help="Privacy budgets kept in a ledger.", no_args_is_help=True)

CONFIGURATION = 2
"""Exit code of a missing ledger, a bad value or a refused change."""


_EPSILON_COLUMNS = ("budget_epsilon", "epsilon_rdp", "epsilon_pld", "remaining")
"""Columns of ``budget show`` printed as epsilons (the report's format); ``delta`` as a delta."""


@budget_app.command("show")
def budget_show(
    ledger: Annotated[Path, typer.Option(help="The ledger file (a site's or the coordinator's).")],
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON document, for machines.")
    ] = False,
) -> None:
    """Scopes, budgets, epsilon spent (RDP and PLD), remaining and entries in a ledger.

    Epsilon is printed to four significant digits, delta in scientific
    notation; --json gives the exact values.
    """
    import accounting
    from reports import budget_table
    from reports.formatting import format_delta, format_epsilon

    if not ledger.is_file():
        fail(f"no ledger at {ledger}", CONFIGURATION)
    try:
        with accounting.Ledger(ledger) as book:
            table = budget_table(book)
    except accounting.LedgerError as error:
        fail(str(error), CONFIGURATION)
    if as_json:
        typer.echo(json.dumps({"ledger": str(ledger), "scopes": table.to_dict(orient="records")}))
    elif table.empty:
        typer.echo(f"{ledger}: no scopes")
    else:
        formatters = {column: format_epsilon for column in _EPSILON_COLUMNS}
        typer.echo(table.to_string(index=False, formatters={**formatters, "delta": format_delta}))


@budget_app.command("set")
def budget_set(
    ledger: Annotated[
        Path,
        typer.Option(help="The ledger file; created if absent (its folder must exist)."),
    ],
    study: Annotated[str, typer.Option(help="The study the budget is approved for.")],
    owner: Annotated[
        str, typer.Option(help="Who holds and enforces the budget: the site, or the coordinator.")
    ],
    epsilon: Annotated[float, typer.Option(help="The epsilon budget (positive, finite).")],
    delta: Annotated[float, typer.Option(help="The delta of the budget (0 < delta < 1).")],
    unit: Annotated[
        str,
        typer.Option(
            help="The unit of privacy: patient (record-level, a site's ledger) or site "
            "(client-level, the coordinator's ledger)."
        ),
    ] = "patient",
    neighbouring: Annotated[
        str,
        typer.Option(
            help="add_or_remove_one or replace_one; fixed when the scope's budget is first set."
        ),
    ] = "add_or_remove_one",
) -> None:
    """Set or change the privacy budget of one scope (unit, owner, study) in a ledger.

    The change is committed to the ledger file and recorded in its budget
    history with the time. A budget below what the scope has already spent
    is refused, with the amount spent; nothing is changed then. Exit code 2
    for a bad value, a missing folder or a refused change.
    """
    import accounting
    from reports.formatting import format_delta, format_epsilon

    if not ledger.parent.is_dir():
        fail(f"--ledger: the folder {ledger.parent} does not exist", CONFIGURATION)
    try:
        scope = accounting.Scope(unit=unit, owner=owner, study=study, neighbouring=neighbouring)
    except accounting.InvalidScope as error:
        fail(f"{_option_named(str(error))}: {error}", CONFIGURATION)
    try:
        with accounting.Ledger(ledger) as book:
            before = _current_budget(book, scope)
            book.set_budget(scope, epsilon=epsilon, delta=delta)
            spent = book.spent(scope, pld=False)
    except accounting.BudgetBelowSpent as refused:
        fail(
            f"--epsilon: {refused} (spent epsilon {format_epsilon(refused.spent)} at delta "
            f"{format_delta(refused.delta)})",
            CONFIGURATION,
        )
    except accounting.InvalidBudget as error:
        fail(f"{_option_named(str(error))}: {error}", CONFIGURATION)
    except accounting.AccountingError as error:
        fail(str(error), CONFIGURATION)
    new = f"epsilon {format_epsilon(epsilon)}, delta {format_delta(delta)}"
    was = (
        "new scope"
        if before is None
        else f"was epsilon {format_epsilon(before.epsilon)}, delta {format_delta(before.delta)}"
    )
    typer.echo(
        f"{ledger}: budget of {scope.level} scope unit={scope.unit}, owner={scope.owner}, "
        f"study={scope.study} set to {new} ({was}); spent epsilon "
        f"{format_epsilon(spent.epsilon)}, remaining {format_epsilon(spent.remaining)}"
    )


def _current_budget(book: accounting.Ledger, scope: accounting.Scope) -> accounting.Budget | None:
    import accounting

    try:
        return book.budget(scope)
    except accounting.UnknownScope:
        return None


_OPTION_OF_MESSAGE = (
    ("epsilon", "--epsilon"),
    ("delta", "--delta"),
    ("scope owner", "--owner"),
    ("scope study", "--study"),
    ("unknown unit of privacy", "--unit"),
    ("unknown neighbouring relation", "--neighbouring"),
)


def _option_named(message: str) -> str:
    """The option a scope or budget error is about (the accounting messages start with it)."""
    for start, option in _OPTION_OF_MESSAGE:
        if message.startswith(start):
            return option
    return "--ledger"
