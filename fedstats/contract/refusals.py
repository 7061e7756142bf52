"""How an error reply is read: which site errors are refusals, and the reason recorded for one.

A site logs a refused request under the reason :func:`refusal_reason` gives;
the coordinator records the same reason in its message inventory, so both
sides' records of one refusal agree.
"""

from __future__ import annotations

from fedstats.errors import (
    DisclosureError,
    FormulaRefusedError,
    ProtocolError,
    ResourceLimitError,
    SiteError,
)

REFUSALS = (DisclosureError, ProtocolError, ResourceLimitError, FormulaRefusedError)
"""Errors that are refusals by the site's rules (logged as "refused", not "error")."""


def refusal_reason(error: SiteError) -> str:
    """The reason a site records for a refused or failed request (for its log and report)."""
    if isinstance(error, DisclosureError):
        return str(error.rule or "disclosure")
    if isinstance(error, ProtocolError):
        return "protocol"
    if isinstance(error, ResourceLimitError):
        return "resources"
    if isinstance(error, FormulaRefusedError):
        return "formula"
    return type(error).__name__
