"""The compliance report's model: every value it shows, as read from a study directory.

The sections follow NIST SP 800-226 (*Guidelines for Evaluating Differential
Privacy Guarantees*, 2025) and the "Expose your epsilons" registry fields
(Dwork, Kohli & Mulligan, J. Privacy and Confidentiality 2019): the claim
and its unit, budgets, mechanisms, trust model, data flows, data provenance,
utility, implementation hazards and audits, reproducibility and sign-off.
The model is built by :func:`reports.build.build_report`; it holds values
read from recorded files (ledgers, inventory, harmonisation reports, fit
records, manifest, configuration), never values assumed, and ``None`` where
a fact was not recorded, which the rendering shows as "not recorded".
Survival curves (Kaplan–Meier fits) are shown in section 8 after the fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from harmonize.report import HarmonizationReport
from studyfiles.fit_records import NOISE_DOMINATES


@dataclass(frozen=True)
class ScopeSummary:
    """One privacy scope (a ledger's budget): sections 1 to 3."""

    owner: str
    unit: str
    level: str
    study: str
    neighbouring: str
    enforced_by: str
    protects_against: str
    ledger_file: str
    budget_epsilon: float
    delta: float
    epsilon_rdp: float
    epsilon_pld: float | None
    pld_note: str | None
    remaining: float
    entries: int
    records_per_patient: str
    timeline: tuple[tuple[datetime, float], ...]
    """``(commit time, cumulative RDP epsilon after the charge)`` per entry."""


@dataclass(frozen=True)
class LedgerEntryRow:
    """One charge, for the mechanisms section and the full ledger appendix."""

    owner: str
    seq: int
    created_at: datetime
    analysis: str | None
    task: str | None
    note: str | None
    mechanism: str
    noise_multipliers: tuple[float, ...]
    sampling: str
    epsilon: float
    epsilon_after: float
    parameters: dict[str, Any]
    package_version: str
    entry_hash: str


@dataclass(frozen=True)
class ScopeMechanism:
    """One scope's part in one private fit: implemented against accounted."""

    owner: str
    unit: str
    releases: int
    implemented_multipliers: tuple[float, ...]
    accounted_multipliers: tuple[float, ...]
    ledger_entries: int
    sampling: str
    epsilon_fit: float
    epsilon_fit_pld: float | None
    fixed_seed: bool

    @property
    def agree(self) -> bool:
        """The ledger's events for the fit hold the fit's noise multipliers, one per release.

        A fit that lists one multiplier for all its releases (client-level)
        agrees when every accounted release used it.
        """
        implemented = list(self.implemented_multipliers)
        if len(implemented) == 1:
            implemented *= self.releases
        return sorted(implemented) == sorted(self.accounted_multipliers)


@dataclass(frozen=True)
class FitMechanism:
    """How a private fit's mechanism was configured and accounted (section 4)."""

    fit: str
    description: str
    analysis: str
    rounds: int
    row_norm: float | None
    options: dict[str, Any] | None
    scopes: tuple[ScopeMechanism, ...]
    settings: tuple[tuple[str, str], ...] = ()
    """The configured options as ``(label, value in words)`` (:func:`reports.labels.settings`)."""
    clipping: str = ""
    """What bounds one unit's contribution, in words (per patient row or per site update)."""


@dataclass(frozen=True)
class FitTrust:
    """Who added the noise and how sums were formed, per fit (section 5)."""

    fit: str
    levels: str
    noise_added_by: str
    secure_aggregation: dict[str, Any] | None
    coordinator_sees: str


@dataclass(frozen=True)
class MessageRow:
    seq: int
    site: str
    task: str
    analysis: str
    status: str
    request_bytes: int
    reply_bytes: int
    sent_at: datetime
    reason: str = ""
    path: str = ""


@dataclass(frozen=True)
class SiteRules:
    """One site's approved protocol and its refusals by reason (section 5)."""

    site: str
    protocol_sha256: str | None
    """The SHA-256 of the protocol the site approved; ``None``: no protocol (every exact
    request inside the site's cell rules and caps is answered)."""
    protocol_recorded: bool
    refusals: tuple[tuple[str, int], ...]
    """``(reason, count)`` of the requests this site refused or failed, most frequent first."""
    verifies_paths: bool | None = None
    """Whether the site answers exact iterative fits only at points it re-derives (its
    fingerprint said so); ``None``: not recorded."""
    verified_answers: int = 0
    """Answers the site gave at points of a verified path (from the message inventory)."""


@dataclass(frozen=True)
class SiteIdentity:
    """One site's node and the key the coordinator reached it by (section 5)."""

    site: str
    node: str | None
    fingerprint: str | None
    """OpenSSH SHA-256 fingerprint of the node's key (``ssh-keygen -lf node.pub``)."""
    enrolled: bool
    """The key is the one the study's enrolment list (signed by the study CA) binds to the site."""


@dataclass(frozen=True)
class RefusedClaim:
    """A node that claimed a site's name with a key not enrolled for it, and was not served."""

    site: str
    node: str
    fingerprint: str | None
    enrolled_fingerprint: str | None


@dataclass(frozen=True)
class SiteIdentities:
    """How sites' names were bound to node keys in this run (section 5)."""

    recorded: bool
    enrolment: str | None
    """The enrolment list checked (``None``: names were not bound to keys)."""
    sites: tuple[SiteIdentity, ...]
    refused: tuple[RefusedClaim, ...]


@dataclass(frozen=True)
class SiteFlow:
    """What left one site (section 6)."""

    site: str
    patients: int | None
    table: pd.DataFrame
    """Per task: messages, refused, bytes out, bytes in, first and last sent (``reports.flows``)."""
    messages: int
    bytes_out: int
    largest_reply: int


@dataclass(frozen=True)
class CoefficientRow:
    term: str
    coef: float
    bse: float | None
    lower: float | None
    upper: float | None
    pvalue: float | None
    reference_coef: float | None
    reference_lower: float | None
    reference_upper: float | None
    noise_share: float | None = None
    """Share of the coefficient's variance that is privacy noise (private fits)."""

    @property
    def noise_dominated(self) -> bool:
        return self.noise_share is not None and self.noise_share > NOISE_DOMINATES

    @property
    def difference(self) -> float | None:
        return None if self.reference_coef is None else self.coef - self.reference_coef

    @property
    def width_ratio(self) -> float | None:
        """Width of this CI over the reference fit's."""
        if None in (self.lower, self.upper, self.reference_lower, self.reference_upper):
            return None
        reference = self.reference_upper - self.reference_lower
        return (self.upper - self.lower) / reference if reference > 0 else None


@dataclass(frozen=True)
class FitSummary:
    """One fit's released results (section 8)."""

    name: str
    description: str
    model: str
    private: bool
    reference: str | None
    alpha: float
    n_obs: dict[str, float]
    n_events: dict[str, float]
    rounds: int
    messages: int
    converged: bool
    notes: tuple[str, ...]
    rows: tuple[CoefficientRow, ...]
    plot: str | None
    """Data URI of the comparison with the reference fit, if there is one."""
    interval_method: str = ""
    utility_warnings: tuple[str, ...] = ()
    """What makes the result misleading, in plain words (empty: nothing recorded)."""
    events_used: float | None = None
    counts_noisy: bool = False
    """Whether the per-site patient and event counts were released with noise (record-level
    privacy); client-level fits receive the sites' exact counts."""

    @property
    def noise_dominated(self) -> bool:
        return bool(self.utility_warnings)


@dataclass(frozen=True)
class CurvePoint:
    """One group's curve at one grid time (``None``: no value, e.g. nobody left at risk)."""

    time: float
    survival: float | None
    lower: float | None
    upper: float | None
    at_risk: float | None
    """Pooled number at risk (noisy under privacy)."""
    events: float | None
    """Pooled events (noisy under privacy)."""
    noise_share: float | None = None
    """Share of the variance of ``log(-log S)`` that is privacy noise (private curves)."""
    released: bool = True
    """Whether the value is a pooled estimate; ``False``: "not released", because some site's
    counts stop earlier (:attr:`CurveGroup.stops`)."""

    @property
    def noise_dominated(self) -> bool:
        return self.noise_share is not None and self.noise_share > NOISE_DOMINATES


@dataclass(frozen=True)
class CurveGroup:
    """One group's curve on the grid."""

    group: str
    median: float | None
    """First grid time with ``S <= 0.5`` (``None``: not reached on the grid, or not where the
    curve is released)."""
    points: tuple[CurvePoint, ...]
    not_released_from: float | None = None
    """The first grid time whose value is not released (``None``: every one is)."""
    stops: tuple[tuple[str, float | None], ...] = ()
    """The sites whose counts stop before :attr:`not_released_from`, each with the last grid
    time its counts reach (``None``: before the first); empty when secure aggregation hides
    them."""


@dataclass(frozen=True)
class CurveSummary:
    """One recorded Kaplan–Meier fit's released curves (section 8, survival curves)."""

    name: str
    description: str
    private: bool
    interval_method: str
    utility_warnings: tuple[str, ...]
    """What makes the curves misleading, in plain words (empty: nothing recorded)."""
    alpha: float
    groups: tuple[CurveGroup, ...]
    secure_aggregation: bool
    noise_multiplier: float | None = None
    noise_sd_per_count: float | None = None
    """Standard deviation of the privacy noise in each summed count."""
    epsilon_spent: dict[str, float] | None = None
    """Each site's cumulative epsilon for the study after this release (private curves)."""
    n_obs: dict[str, int] | None = None
    """Patients per site (exact curves; sites release no exact count under privacy)."""
    truncated: dict[str, int] | None = None
    """Patients censored at their site's safe horizon, per site (exact curves)."""
    horizon_warnings: tuple[str, ...] = ()
    """Each group whose pooled curve is not released to the grid's end, with the sites and
    horizons that stop it."""
    horizons: dict[str, dict[str, float | None]] | None = None
    """Per site and group, the last grid time its counts reach (``None``: before the first)."""

    @property
    def noise_dominated(self) -> bool:
        return bool(self.utility_warnings)


@dataclass(frozen=True)
class Diagnostic:
    title: str
    table: pd.DataFrame
    name: str = ""
    """The name it was recorded under (``diagnostics/<name>.json``)."""


@dataclass(frozen=True)
class SeedUse:
    """Whether a scope's noise in a fit or survival curve came from a fixed seed (section 9)."""

    fit: str
    owner: str
    fixed_seed: bool


@dataclass(frozen=True)
class Audit:
    name: str
    method: str
    epsilon_lower: float
    confidence: float
    delta: float
    canaries: int
    guesses: int
    correct: int
    accounted_epsilon: float | None
    private: bool


@dataclass(frozen=True)
class LedgerIntegrity:
    """A ledger file's verification and the last hash of each scope (section 10)."""

    file: str
    ok: bool
    problems: tuple[str, ...]
    heads: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class HeadCheck:
    """A site's ledger chain head recorded by the coordinator, compared with the ledger read.

    ``state`` is ``"extends"`` (the ledger holds the recorded history),
    ``"rewritten"`` (it does not: ``problem`` says how) or ``"not compared"``
    (the site's ledger is not in the study directory: it stays at the site,
    which compares the head at its next run).
    """

    owner: str
    study: str
    entries: int
    head: str
    state: str
    problem: str | None = None


@dataclass(frozen=True)
class AnalysisRow:
    """One analysis of the message inventory and the recorded result it produced
    (:func:`reports.analyses.analysis_rows`)."""

    analysis: str
    tasks: tuple[str, ...]
    sites: tuple[str, ...]
    answered: int
    """Answers that left the sites (status ``ok``)."""
    refused: int
    """Requests refused, failed or unanswered."""
    result_kind: str | None
    result: str | None
    """The recorded result these answers made (``None``: no recorded result names it)."""


@dataclass(frozen=True)
class ReleaseSummary:
    """A recorded release other than a fit, curve or diagnostic (a trained network, metrics)."""

    name: str
    kind: str
    description: str
    private: bool
    sites: tuple[str, ...]
    analyses: tuple[str, ...]
    table: pd.DataFrame
    notes: tuple[str, ...]


@dataclass(frozen=True)
class ReleasedResult:
    """One line of the first page's list of what left the sites."""

    name: str
    kind: str
    description: str
    protection: str
    """``exact: disclosure control only`` or the levels of differential privacy it used."""
    analyses: tuple[str, ...]
    """The analyses (message-inventory labels) whose answers made it."""
    private: bool


@dataclass(frozen=True)
class LinkageField:
    """How one identifier field entered the encodings (never a value)."""

    field: str
    """The identifier, in words (``given name``)."""
    ngram: str
    bits: str
    """Bit insertions, e.g. ``200 for the field`` or ``8 per n-gram``."""
    positional: str


@dataclass(frozen=True)
class LinkageSite:
    """One site's part in a linkage, each count as the report prints it (``< k`` when
    suppressed, ``withheld`` when it would reveal a suppressed count by subtraction)."""

    site: str
    role: str
    records_sent: str
    linked: str
    never_compared: str


@dataclass(frozen=True)
class ScoreBin:
    """One bin of the linked pairs' Dice scores."""

    low: float
    high: float
    count: str
    state: str
    """``"shown"``, ``"suppressed"`` (1 to k - 1 pairs) or ``"withheld"`` (a count of at least
    k not shown, so that the suppressed ones cannot be worked out from the total)."""


@dataclass(frozen=True)
class LinkageSummary:
    """One record linkage (section 6, record linkage; :mod:`reports.linkages`)."""

    linkage_id: str
    created: datetime
    schema_fingerprint: str
    fields: tuple[LinkageField, ...]
    length: int
    hashing: str
    hashing_warning: str | None
    xor_folds: str
    threshold: float
    blocking: str
    blocking_reveals: str
    secret: str
    sites: tuple[LinkageSite, ...]
    pairs: str
    candidate_pairs: str
    k: int
    bins: tuple[ScoreBin, ...]
    """The score histogram (empty: not shown, :attr:`histogram_note` says why)."""
    histogram_note: str
    plot: str | None
    protects: str
    """One sentence: what the encodings protect and what they do not."""


@dataclass(frozen=True)
class Verdict:
    """The verdict paragraph and the facts a reader (or a test) may want to check in it."""

    text: str
    within_budget: tuple[str, ...]
    """Scopes whose spent RDP ε is at most their budget."""
    over_budget: tuple[str, ...]
    """Scopes whose spent RDP ε exceeds their budget (a ledger enforces this never happens)."""
    ledgers_recorded: bool


@dataclass(frozen=True)
class ComplianceReport:
    """Everything the report shows, section by section."""

    study: str
    description: str
    recorded_at: datetime
    scopes: tuple[ScopeSummary, ...]
    timeline_plot: str | None
    mechanisms: tuple[FitMechanism, ...]
    ledger_entries: tuple[LedgerEntryRow, ...]
    fits_trust: tuple[FitTrust, ...]
    disclosure: dict[str, Any] | None
    refused: tuple[MessageRow, ...]
    site_rules: tuple[SiteRules, ...]
    flows: tuple[SiteFlow, ...]
    messages: tuple[MessageRow, ...] | None
    harmonization: tuple[HarmonizationReport, ...]
    fits: tuple[FitSummary, ...]
    diagnostics: tuple[Diagnostic, ...]
    noise_seed: int | None
    noise_seed_recorded: bool
    seeds: tuple[SeedUse, ...]
    audits: tuple[Audit, ...]
    package_versions: dict[str, str]
    platform: str
    hashes: dict[str, str]
    fingerprints: tuple[tuple[str, str, str, str], ...]
    """``(site, schema fingerprint digest, specification digest, data digest)``; the data
    digest is "" for a harmonisation report that predates it."""
    ledgers: tuple[LedgerIntegrity, ...]
    configuration: dict[str, Any]
    sign_off_roles: tuple[str, ...]
    curves: tuple[CurveSummary, ...] = ()
    """Recorded Kaplan–Meier fits (empty for a study that recorded none)."""
    verdict: Verdict | None = None
    """The first page's plain-language verdict (:func:`reports.verdict.verdict`)."""
    site_identities: SiteIdentities | None = None
    """Each site's node key fingerprint and refused claims (``None``: not a Flower run)."""
    ledger_heads: tuple[HeadCheck, ...] = ()
    """The sites' recorded chain heads against the ledgers read (:mod:`reports.heads`)."""
    releases: tuple[ReleaseSummary, ...] = ()
    """Other recorded releases: trained networks, metrics, tables (section 8)."""
    analyses: tuple[AnalysisRow, ...] = ()
    """Every analysis of the message inventory and the result it produced (section 6)."""
    released: tuple[ReleasedResult, ...] = ()
    """Every recorded result, for the first page (:func:`reports.analyses.released_results`)."""
    linkages: tuple[LinkageSummary, ...] = ()
    """The record linkages of the study (section 6; empty: none recorded)."""
