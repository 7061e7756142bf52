"""Regulator-facing reports built only from what the other packages recorded.

So far: the data-flow table (what left each site, from a federation's
message inventory) and the budget table (scopes of a privacy ledger).
Harmonisation provenance and the HTML/PDF report join as those records
exist.
"""

from reports.budgets import budget_table
from reports.flows import data_flows

__all__ = ["budget_table", "data_flows"]
