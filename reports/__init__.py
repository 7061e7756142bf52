"""Regulator-facing reports built only from what the other packages recorded.

So far: the data-flow table (what left each site, from a federation's
message inventory). Ledgers, harmonisation provenance and the HTML/PDF
report join as those records exist.
"""

from reports.flows import data_flows

__all__ = ["data_flows"]
