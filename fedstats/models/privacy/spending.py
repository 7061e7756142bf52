"""What a private fit spent, per privacy scope, as its results report it
(:class:`PrivacyAccount`, :class:`ScopeSpending`)."""

from __future__ import annotations

import dataclasses
import math
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dp_accounting

import accounting
from fedstats.models.privacy.planning import COORDINATOR, coordinator_ledger, coordinator_scope


@dataclass(frozen=True)
class ScopeSpending:
    """What one privacy scope paid for a fit, and where it stands."""

    unit: str  # "patient" or "site"
    owner: str
    epsilon: float  # this fit's events, RDP
    epsilon_pld: float | None  # this fit's events, PLD
    delta: float
    cumulative_epsilon: float | None  # the scope's ledger after the fit (RDP)
    budget_epsilon: float | None
    noise_multipliers: tuple[float, ...]
    releases: int
    fixed_seed: bool
    ledger_entries: int | None = None
    """The scope's ledger entry count after the fit's last charge (the site's reply)."""
    ledger_head: str | None = None
    """The scope's ledger chain head after that charge (:class:`accounting.ChainHead`): the
    study record keeps it, so a ledger rewritten later no longer extends it."""


def reply_ledger_head(reply: Mapping[str, Any]) -> tuple[int, str] | None:
    """The (entry count, chain head) a private reply carries, or None when it carries none
    or a malformed one.

    The head is the site's own claim (:data:`fedstats.contract.dp_request.DP_REPLY_FIELDS`):
    a count that is not a whole number, or a head that is not a sha256 hex digest, is not
    kept, so one site cannot break a fit or the study record the other sites' heads are in.
    """
    entries, head = reply.get("dp_ledger_entries"), reply.get("dp_ledger_head")
    if isinstance(entries, bool) or not isinstance(entries, int | float):
        return None
    if not (math.isfinite(entries) and entries >= 0 and float(entries).is_integer()):
        return None
    if not (isinstance(head, str) and len(head) == 64 and set(head) <= set(string.hexdigits)):
        return None
    return int(entries), head


def site_spending(
    site: str,
    event: dp_accounting.DpEvent,
    delta: float,
    reply: Mapping[str, Any],
    noise_multipliers: tuple[float, ...],
    releases: int,
) -> ScopeSpending:
    """What one site's record-level scope paid for a fit's ``event``, and where it now stands.

    The cumulative figures and the ledger's chain head are the public facts the
    site added to its last private reply
    (:data:`fedstats.contract.dp_request.DP_REPLY_FIELDS`).
    """
    rdp, pld = fit_epsilon(event, delta)
    entries, head = reply_ledger_head(reply) or (None, None)
    return ScopeSpending(
        unit="patient",
        owner=site,
        epsilon=rdp,
        epsilon_pld=pld,
        delta=delta,
        cumulative_epsilon=reply.get("dp_epsilon_spent"),
        budget_epsilon=reply.get("dp_budget_epsilon"),
        noise_multipliers=noise_multipliers,
        releases=releases,
        fixed_seed=bool(reply.get("dp_fixed_seed", False)),
        ledger_entries=entries,
        ledger_head=head,
    )


def coordinator_spending(
    federation: Any,
    event: dp_accounting.DpEvent,
    noise_multipliers: tuple[float, ...],
    releases: int,
    delta: float | None = None,
) -> ScopeSpending:
    """What the coordinator's client-level scope paid for a fit's ``event``, and where it now
    stands (its ledger's RDP figures). ``delta`` defaults to the delta of the coordinator's
    budget, the one its ledger enforces."""
    spent = coordinator_ledger(federation).spent(coordinator_scope(federation.study), pld=False)
    delta = spent.delta if delta is None else delta
    rdp, pld = fit_epsilon(event, delta)
    return ScopeSpending(
        unit="site",
        owner=COORDINATOR,
        epsilon=rdp,
        epsilon_pld=pld,
        delta=delta,
        cumulative_epsilon=spent.epsilon,
        budget_epsilon=spent.budget_epsilon,
        noise_multipliers=noise_multipliers,
        releases=releases,
        fixed_seed=federation.noise_seed is not None,
    )


@dataclass(frozen=True)
class PrivacyAccount:
    """The privacy a fit spent, per scope, with the mechanisms it used."""

    scopes: tuple[ScopeSpending, ...]
    rounds: int
    row_norm: float | None
    neighbouring: str = "add or remove one"
    secure_aggregation: Mapping[str, Any] | None = None
    """How the sums were aggregated when secure aggregation was used: protocol,
    threshold ``t``, sites, fixed-point bits, sessions, and each dropout."""

    def with_secure_aggregation(self, record: Mapping[str, Any]) -> PrivacyAccount:
        return dataclasses.replace(self, secure_aggregation=dict(record))

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([s.__dict__ for s in self.scopes])

    def notes(self) -> list[str]:
        out = []
        for s in self.scopes:
            level = "record-level" if s.unit == "patient" else "client-level"
            pld = f", PLD {s.epsilon_pld:.3f}" if s.epsilon_pld is not None else ""
            total = (
                f"; ledger now {s.cumulative_epsilon:.3f} of {s.budget_epsilon:.3f}"
                if s.cumulative_epsilon is not None
                else ""
            )
            out.append(
                f"{level} DP at {s.owner}: this fit epsilon {s.epsilon:.3f} (RDP{pld}) at delta "
                f"{s.delta:g}, {s.releases} Gaussian releases (one ledger entry per request, "
                "which may hold several), noise multipliers "
                f"{min(s.noise_multipliers):.3f}-{max(s.noise_multipliers):.3f}{total}"
                + ("; FIXED NOISE SEED" if s.fixed_seed else "")
            )
        if self.secure_aggregation:
            sa = self.secure_aggregation
            out.append(
                f"secure aggregation: the coordinator saw only sums of {sa['sites']} sites "
                f"(threshold {sa['threshold']}, {sa['sessions']} sessions, "
                f"{len(sa['dropouts'])} dropouts); each site added 1/sqrt({sa['threshold']}) of "
                "the noise"
            )
        return out


def fit_epsilon(event: dp_accounting.DpEvent, delta: float) -> tuple[float, float | None]:
    """RDP and PLD epsilon of one fit's events at ``delta`` (PLD ``None`` if unsupported)."""
    rdp = accounting.rdp_epsilon([event], delta)
    try:
        pld = accounting.pld_epsilon([event], delta)
    except accounting.UnsupportedMechanism:
        pld = None
    return rdp, pld
