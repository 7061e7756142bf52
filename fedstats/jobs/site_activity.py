"""What a site's batch run served, charged and refused, read from its journal and ledger.

The run record of ``fedstats site run`` is derived only from the site's own
durable records: the journal lines added during the run
(:mod:`fedstats.jobs.site_journal`: ``received`` and ``answered`` per request)
and the ledger's scopes before and after. Nothing here trusts what a
transport reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import accounting

BUDGET_ERRORS = frozenset({"BudgetExceededError", "NoBudgetError"})
"""Error types of a reply refused because of the site's privacy budget."""
LEDGER_ERRORS = frozenset({"SiteLedgerIntegrityError"})
"""Error types of a reply refused because the site's privacy ledger does not verify."""
DISCLOSURE_ERRORS = frozenset(
    {"DisclosureError", "ProtocolError", "FormulaRefusedError", "ResourceLimitError"}
)
"""Error types of a reply refused by the site's rules (disclosure control, its approved
protocol, the formula grammar, its resource limits)."""

EXHAUSTED = 1e-9
"""A scope with at most this much epsilon left is spent."""


@dataclass(frozen=True)
class ScopeState:
    """One ledger scope's entry count and RDP epsilon spent, at one moment."""

    entries: int
    epsilon: float
    remaining: float


def ledger_state(ledger: accounting.Ledger) -> dict[accounting.Scope, ScopeState]:
    """Every scope of ``ledger`` with its entries, RDP spending and what is left."""
    state = {}
    for scope in ledger.scopes():
        spent = ledger.spent(scope, pld=False)
        state[scope] = ScopeState(spent.entries, spent.epsilon, spent.remaining)
    return state


def spent_scopes(state: dict[accounting.Scope, ScopeState], site: str) -> list[accounting.Scope]:
    """The site's own scopes if *every* one of them is spent (none left to release from)."""
    own = {scope: s for scope, s in state.items() if scope.owner == site}
    if own and all(s.remaining <= EXHAUSTED for s in own.values()):
        return list(own)
    return []


@dataclass
class Activity:
    """Requests of one run: served per task, refused one by one, charges per scope."""

    served: dict[str, dict[str, int]] = field(default_factory=dict)
    refused: list[dict[str, Any]] = field(default_factory=list)
    charged: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    open_requests: int = 0

    @property
    def budget_refusals(self) -> list[dict[str, Any]]:
        return [r for r in self.refused if r["error_type"] in BUDGET_ERRORS]

    @property
    def ledger_refusals(self) -> list[dict[str, Any]]:
        return [r for r in self.refused if r["error_type"] in LEDGER_ERRORS]

    @property
    def disclosure_refusals(self) -> list[dict[str, Any]]:
        return [r for r in self.refused if r["error_type"] in DISCLOSURE_ERRORS]

    @property
    def entries_added(self) -> int:
        return sum(c["entries_added"] for c in self.charged)

    def as_record(self) -> dict[str, Any]:
        """The run record's ``served``, ``charged`` and ``refused`` entries."""
        return {
            "requests": self.requests,
            "open_requests": self.open_requests,
            "served": {
                "tasks": self.served,
                "count": sum(t["count"] for t in self.served.values()),
                "request_bytes": sum(t["request_bytes"] for t in self.served.values()),
                "reply_bytes": sum(t["reply_bytes"] for t in self.served.values()),
            },
            "charged": {
                "ledger_entries_added": self.entries_added,
                "epsilon_added": sum(c["epsilon_added"] for c in self.charged),
                "scopes": self.charged,
            },
            "refused": self.refused,
        }


def activity(
    lines: list[dict[str, Any]],
    before: dict[accounting.Scope, ScopeState],
    after: dict[accounting.Scope, ScopeState],
) -> Activity:
    """Summarise the journal ``lines`` added in a run and the ledger change over it."""
    result = Activity()
    received = {r["seq"]: r for r in lines if r.get("event") == "received"}
    closed = set()
    for record in lines:
        if record.get("event") != "answered":
            continue
        closed.add(record["seq"])
        task = str(record.get("task", "?"))
        if record.get("status") == "released":
            row = result.served.setdefault(task, {"count": 0, "request_bytes": 0, "reply_bytes": 0})
            row["count"] += 1
            row["request_bytes"] += int(received.get(record["seq"], {}).get("request_bytes", 0))
            row["reply_bytes"] += int(record.get("reply_bytes", 0))
        else:
            result.refused.append(
                {
                    "seq": record["seq"],
                    "task": task,
                    "status": record.get("status", "?"),
                    "error_type": record.get("error_type", ""),
                    "reason": record.get("reason", ""),
                    "detail": record.get("detail", ""),
                }
            )
    result.requests = len(received)
    result.open_requests = len(set(received) - closed)
    for scope, state in after.items():
        old = before.get(scope, ScopeState(0, 0.0, state.remaining))
        if state.entries != old.entries:
            result.charged.append(
                {
                    "scope": {"unit": scope.unit, "owner": scope.owner, "study": scope.study},
                    "entries_added": state.entries - old.entries,
                    "epsilon_before": old.epsilon,
                    "epsilon_after": state.epsilon,
                    "epsilon_added": state.epsilon - old.epsilon,
                    "remaining": state.remaining,
                }
            )
    return result
