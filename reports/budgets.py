"""Budgets: one row per scope of a ledger, as the ledger recorded it."""

from __future__ import annotations

import pandas as pd

import accounting

COLUMNS = [
    "study",
    "unit",
    "level",
    "owner",
    "neighbouring",
    "budget_epsilon",
    "delta",
    "epsilon_rdp",
    "epsilon_pld",
    "remaining",
    "entries",
]


def budget_table(ledger: accounting.Ledger) -> pd.DataFrame:
    """Scopes with budget, epsilon spent (RDP enforces; PLD beside it), remaining and entries."""
    rows = []
    for scope in ledger.scopes():
        spent = ledger.spent(scope)
        rows.append(
            {
                "study": scope.study,
                "unit": scope.unit,
                "level": "record-level" if scope.unit == "patient" else "client-level",
                "owner": scope.owner,
                "neighbouring": scope.neighbouring,
                "budget_epsilon": spent.budget_epsilon,
                "delta": spent.delta,
                "epsilon_rdp": spent.epsilon,
                "epsilon_pld": spent.epsilon_pld,
                "remaining": spent.remaining,
                "entries": spent.entries,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)
