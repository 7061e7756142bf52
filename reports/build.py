"""Building the report model (:mod:`reports.model`) from a loaded :class:`~reports.study.Study`.

Each figure is copied from a recorded source:

* scopes, budgets, epsilons (RDP and PLD), remaining, entry counts and the
  timeline: the ledgers (``Ledger.spent``, ``Ledger.entries``; the timeline
  plots each entry's ``epsilon_after``, the scope's cumulative RDP epsilon
  committed with that charge);
* mechanisms: the ledgers' events (:mod:`reports.mechanisms`) beside the
  fits' privacy accounts and the privacy options in the configuration;
* trust model: the fits' privacy accounts (secure aggregation is read with
  ``getattr``-like lookups and shown as not used when absent), the
  configuration's disclosure policy, the inventory's refused messages;
* data flows: the message inventory (:func:`reports.flows.data_flows`);
* harmonisation: the sites' reports; results: the fit records; survival
  curves: the curve records (:mod:`reports.curves`);
* record linkage: the linkage records the linkage unit wrote
  (:mod:`reports.linkages`);
* reproducibility: the manifest, the harmonisation fingerprints and the
  ledgers' hash chains.
"""

from __future__ import annotations

import tomllib
from collections import Counter
from dataclasses import replace

import pandas as pd

from accounting import describe_event
from harmonize.fingerprint import SiteFingerprint
from reports.analyses import analysis_rows, release_summaries, released_results
from reports.curves import curve_summary
from reports.flows import data_flows
from reports.formatting import format_number
from reports.heads import head_checks
from reports.labels import settings, term_label
from reports.linkages import linkage_summary
from reports.mechanisms import event_facts
from reports.model import (
    Audit,
    CoefficientRow,
    ComplianceReport,
    Diagnostic,
    FitMechanism,
    FitSummary,
    FitTrust,
    LedgerEntryRow,
    LedgerIntegrity,
    MessageRow,
    RefusedClaim,
    ScopeMechanism,
    ScopeSummary,
    SeedUse,
    SiteFlow,
    SiteIdentities,
    SiteIdentity,
    SiteRules,
)
from reports.plots import coefficient_comparison, epsilon_timeline
from reports.records import FitRecord
from reports.study import ScopeRecord, Study
from reports.verdict import verdict
from studyfiles.inventory import MessageInventory

SIGN_OFF_ROLES = (
    "Chief investigator",
    "Study statistician",
    "Data protection officer",
    "Privacy officer of each participating site",
    "Ethics committee / IRB representative",
)

PROTECTS_AGAINST = {
    "patient": (
        "anyone who sees what the site released: the coordinator, the analysts, the other "
        "sites and every reader of the results, whatever else they know"
    ),
    "site": (
        "anyone who sees the coordinator's released results (analysts and readers); not the "
        "coordinator itself, which receives each site's clipped contribution before adding noise"
    ),
}
DISTRIBUTED_NOISE = (
    "; for the {count} of {total} charges released under secure aggregation (threshold "
    "{threshold}), each site added only its share of the noise, so the guarantee also counts on "
    "at least {threshold} sites adding theirs and on the coordinator seeing only masked replies "
    "and their sum (it follows the protocol and does not collude with sites)"
)
ENFORCED_BY = {
    "patient": "the site's own ledger, charged before each release leaves the site",
    "site": "the coordinator's ledger, charged before each noisy aggregate is used",
}


def build_report(study: Study) -> ComplianceReport:
    """The report model of ``study``."""
    scopes = tuple(_scope_summary(study, record) for record in study.scopes)
    timeline = epsilon_timeline([(s.owner, s.level, s.timeline, s.budget_epsilon) for s in scopes])
    inventory = study.inventory
    messages = None if inventory is None else tuple(_message_rows(inventory))
    report = ComplianceReport(
        study=study.manifest.study,
        description=_description(study.spec_text),
        recorded_at=study.manifest.finished_at,
        scopes=scopes,
        timeline_plot=timeline,
        mechanisms=tuple(_mechanism(study, fit) for fit in study.fits if fit.result.privacy),
        ledger_entries=tuple(_entry_rows(study)),
        fits_trust=tuple(_trust(fit) for fit in study.fits),
        disclosure=study.configuration.get("disclosure"),
        refused=tuple(m for m in messages or () if m.status != "ok"),
        site_rules=_site_rules(study, messages),
        flows=() if inventory is None else tuple(_flows(study, inventory)),
        messages=messages,
        harmonization=tuple(study.harmonization.values()),
        fits=tuple(_fit_summary(study, fit) for fit in study.fits),
        curves=tuple(curve_summary(curve) for curve in study.curves),
        diagnostics=tuple(
            Diagnostic(d.title, pd.DataFrame(d.rows, columns=d.columns), name)
            for name, d in study.diagnostics.items()
        ),
        releases=release_summaries(study),
        released=released_results(study),
        analyses=() if inventory is None else analysis_rows(study, inventory),
        noise_seed=study.configuration.get("noise_seed"),
        noise_seed_recorded="noise_seed" in study.configuration,
        seeds=(
            *(
                SeedUse(fit.name, s.owner, s.fixed_seed)
                for fit in study.fits
                if fit.result.privacy
                for s in fit.result.privacy.scopes
            ),
            *(
                SeedUse(curve.name, site, fixed)
                for curve in study.curves
                for site, fixed in (curve.result.fixed_seed or {}).items()
            ),
        ),
        audits=tuple(
            Audit(
                name,
                a.method,
                a.epsilon_lower,
                a.confidence,
                a.delta,
                a.canaries,
                a.guesses,
                a.correct,
                a.accounted_epsilon,
                a.private,
            )
            for name, a in study.audits.items()
        ),
        package_versions=dict(study.manifest.package_versions),
        platform=study.manifest.platform,
        hashes=dict(study.manifest.hashes),
        fingerprints=tuple(
            (
                site,
                SiteFingerprint.from_record(r.fingerprint).digest,
                r.spec_digest,
                r.data_sha256,
            )
            for site, r in study.harmonization.items()
            if r.fingerprint
        ),
        ledgers=tuple(
            LedgerIntegrity(
                ledger.path.name,
                ledger.verification.ok,
                tuple(ledger.verification.problems),
                tuple(
                    (s.scope.owner, s.entries[-1].entry_hash if s.entries else "no entries")
                    for s in ledger.scopes
                ),
            )
            for ledger in study.ledgers
        ),
        configuration=study.configuration,
        sign_off_roles=SIGN_OFF_ROLES,
        site_identities=_site_identities(study),
        ledger_heads=head_checks(study),
        linkages=tuple(linkage_summary(record) for record in study.linkages),
    )
    return replace(report, verdict=verdict(report))


def _description(spec_text: str) -> str:
    try:
        return str(tomllib.loads(spec_text).get("study", {}).get("description", ""))
    except tomllib.TOMLDecodeError:
        return ""


def _scope_summary(study: Study, record: ScopeRecord) -> ScopeSummary:
    scope, spent = record.scope, record.spent
    harmonized = study.harmonization.get(scope.owner)
    if scope.unit == "site":
        per_patient = "not applicable: the unit is a whole site, with all of its patients"
    elif harmonized is not None:
        per_patient = (
            f"1: the analysis frame holds one row per patient ({harmonized.patients:,} rows, "
            f"harmonisation report of {scope.owner})"
        )
    else:
        per_patient = "not recorded (no harmonisation report for this site)"
    return ScopeSummary(
        owner=scope.owner,
        unit=scope.unit,
        level=scope.level,
        study=scope.study,
        neighbouring=scope.relation.describe(scope.privacy_unit),
        enforced_by=ENFORCED_BY[scope.unit],
        protects_against=PROTECTS_AGAINST[scope.unit]
        + _distributed_noise(record)
        + (_few_sites(study) if scope.unit == "site" else ""),
        ledger_file=record.ledger.name,
        budget_epsilon=spent.budget_epsilon,
        delta=spent.delta,
        epsilon_rdp=spent.epsilon,
        epsilon_pld=spent.epsilon_pld,
        pld_note=spent.pld_note,
        remaining=spent.remaining,
        entries=spent.entries,
        records_per_patient=per_patient,
        timeline=tuple((e.created_at, e.epsilon_after) for e in record.entries),
    )


def _few_sites(study: Study) -> str:
    """Client-level DP with few sites, said plainly; the count comes from the inventory."""
    if study.inventory is not None and len(study.inventory):
        sites = sorted(set(study.inventory.to_frame()["site"]))
        source = "sites in the message inventory"
    elif study.harmonization:
        sites = sorted(study.harmonization)
        source = "sites with a harmonisation report"
    else:
        return ". How many sites took part is not recorded"
    return (
        f". With {len(sites)} {source}, this guarantee is weak: to hide one whole hospital the "
        "noise must be as large as that hospital's entire contribution, so the released "
        "results either carry little signal or the epsilon is loose; it protects a site's "
        "participation from outside readers, it is not confidentiality of a site's data"
    )


def _distributed_noise(record: ScopeRecord) -> str:
    """The trust the claim rests on when some charges were for securely aggregated releases."""
    thresholds = [
        e.parameters["secure_aggregation_threshold"]
        for e in record.entries
        if "secure_aggregation_threshold" in (e.parameters or {})
    ]
    if not thresholds:
        return ""
    return DISTRIBUTED_NOISE.format(
        count=len(thresholds), total=len(record.entries), threshold=min(thresholds)
    )


def _entry_rows(study: Study) -> list[LedgerEntryRow]:
    rows = []
    for record in study.scopes:
        for entry in record.entries:
            facts = event_facts(entry.event_json)
            rows.append(
                LedgerEntryRow(
                    owner=record.scope.owner,
                    seq=entry.seq,
                    created_at=entry.created_at,
                    analysis=entry.analysis,
                    task=entry.task,
                    note=entry.note,
                    mechanism=describe_event(entry.event),
                    noise_multipliers=facts.noise_multipliers,
                    sampling=facts.sampling_text,
                    epsilon=entry.epsilon,
                    epsilon_after=entry.epsilon_after,
                    parameters=entry.parameters,
                    package_version=entry.package_version,
                    entry_hash=entry.entry_hash,
                )
            )
    return rows


def _mechanism(study: Study, fit: FitRecord) -> FitMechanism:
    privacy = fit.result.privacy
    analysis = fit.result.provenance.analysis
    by_owner = {s.scope.owner: s for s in study.scopes}
    scopes = []
    for spending in privacy.scopes:
        record = by_owner.get(spending.owner)
        entries = [e for e in (record.entries if record else ()) if e.analysis == analysis]
        facts = [event_facts(e.event_json) for e in entries]
        sampling = sorted({f.sampling_text for f in facts}) or ["no ledger entry for this fit"]
        scopes.append(
            ScopeMechanism(
                owner=spending.owner,
                unit=spending.unit,
                releases=spending.releases,
                implemented_multipliers=tuple(spending.noise_multipliers),
                accounted_multipliers=tuple(m for f in facts for m in f.noise_multipliers),
                ledger_entries=len(entries),
                sampling="; ".join(sampling),
                epsilon_fit=spending.epsilon,
                epsilon_fit_pld=spending.epsilon_pld,
                fixed_seed=spending.fixed_seed,
            )
        )
    options = study.configuration.get("privacy", {}).get(fit.name)
    options = options if isinstance(options, dict) else None
    return FitMechanism(
        fit=fit.name,
        description=fit.description,
        analysis=analysis,
        rounds=privacy.rounds,
        row_norm=privacy.row_norm,
        options=options,
        scopes=tuple(scopes),
        settings=settings(options) if options else (),
        clipping=_clipping(privacy.row_norm, {s.unit for s in privacy.scopes}, options or {}),
    )


def _clipping(row_norm: float | None, units: set[str], options: dict) -> str:
    """What bounds one unit's contribution, in words: a patient's scaled design row under
    record-level privacy, a site's whole update under client-level privacy."""
    parts = []
    if row_norm is not None:
        parts.append(
            "each patient's scaled design row is bounded in L2 norm by "
            f"B = {format_number(row_norm)}, so one patient changes each released sum by a "
            "bounded amount"
        )
    if "site" in units:
        clips = [
            f"{what} to {format_number(options[key])}"
            for key, what in (
                ("gradient_clip", "its score (L2 norm)"),
                ("hessian_clip", "its information matrix (Frobenius norm)"),
            )
            if isinstance(options.get(key), int | float)
        ]
        parts.append(
            "each site's whole update in each round is clipped at the coordinator"
            + (f": {' and '.join(clips)}" if clips else " (clipping bounds not recorded)")
            + ", so one site changes the noisy sum by a bounded amount; no per-patient "
            "bound applies at this level"
        )
    return "; ".join(parts) or "not recorded"


def _trust(fit: FitRecord) -> FitTrust:
    privacy = fit.result.privacy
    if privacy is None:
        return FitTrust(
            fit.name,
            "none (exact aggregates)",
            "no noise",
            None,
            "each site's exact aggregates (gradients, information matrices, counts)",
        )
    units = sorted({s.unit for s in privacy.scopes})
    levels = ", ".join("record-level" if u == "patient" else "client-level" for u in units)
    by = []
    secure = getattr(privacy, "secure_aggregation", None)
    if "patient" in units and secure:
        by.append(
            f"each site, its 1/sqrt({secure.get('threshold')}) share of one central noise, "
            "before its masked reply leaves it"
        )
    elif "patient" in units:
        by.append("each site, before its reply leaves it")
    if "site" in units:
        by.append("the coordinator, to the sum of clipped site contributions")
    if secure:
        sees = "only masked shares and the noisy sum of the sites' aggregates"
    elif "patient" in units:
        sees = "each site's noisy aggregates"
    else:
        sees = "each site's exact (clipped) aggregates before it adds noise"
    return FitTrust(fit.name, levels, "; ".join(by), dict(secure) if secure else None, sees)


def _message_rows(inventory: MessageInventory) -> list[MessageRow]:
    return [
        MessageRow(
            r.seq,
            r.site,
            r.task,
            r.analysis,
            r.status,
            r.request_bytes,
            r.reply_bytes,
            r.sent_at,
            r.reason,
            r.path,
        )
        for r in inventory
    ]


def _site_rules(study: Study, messages: tuple[MessageRow, ...] | None) -> tuple[SiteRules, ...]:
    """Each site's protocol digest and whether it verifies paths (recorded from its
    fingerprint reply), its refusals counted by reason and its answers on verified paths
    (from the message inventory)."""
    protocols = study.configuration.get("site_protocols")
    recorded = isinstance(protocols, dict)
    paths = study.configuration.get("site_paths")
    verifying = set(paths) if isinstance(paths, list) else None
    sites = dict.fromkeys([*(protocols or {}), *(m.site for m in messages or ())])
    rows = []
    for site in sites:
        reasons = Counter(
            m.reason or m.status for m in messages or () if m.site == site and m.status != "ok"
        )
        digest = protocols.get(site) if recorded else None
        rows.append(
            SiteRules(
                site=site,
                protocol_sha256=digest if isinstance(digest, str) else None,
                protocol_recorded=recorded and site in protocols,
                refusals=tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
                verifies_paths=None if verifying is None else site in verifying,
                verified_answers=sum(
                    1 for m in messages or () if m.site == site and m.path == "verified"
                ),
            )
        )
    return tuple(rows)


def _site_identities(study: Study) -> SiteIdentities | None:
    """Each site's node key fingerprint and the refused claims, as the coordinator recorded
    them (``configuration.json`` ``site_identity``); ``None`` for a study recorded without it."""
    recorded = study.configuration.get("site_identity")
    if not isinstance(recorded, dict):
        return None
    sites = recorded.get("sites") if isinstance(recorded.get("sites"), dict) else {}
    refused = recorded.get("refused") if isinstance(recorded.get("refused"), list) else []
    return SiteIdentities(
        recorded=bool(recorded.get("recorded")),
        enrolment=_text_or_none(recorded.get("enrolment")),
        sites=tuple(
            SiteIdentity(
                site=str(site),
                node=_text_or_none(row.get("node")),
                fingerprint=_text_or_none(row.get("fingerprint")),
                enrolled=row.get("enrolled") is True,
            )
            for site, row in sites.items()
            if isinstance(row, dict)
        ),
        refused=tuple(
            RefusedClaim(
                site=str(row.get("site")),
                node=str(row.get("node")),
                fingerprint=_text_or_none(row.get("fingerprint")),
                enrolled_fingerprint=_text_or_none(row.get("enrolled_fingerprint")),
            )
            for row in refused
            if isinstance(row, dict)
        ),
    )


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _flows(study: Study, inventory: MessageInventory) -> list[SiteFlow]:
    table = data_flows(inventory)
    frame = inventory.to_frame()
    flows = []
    for site in table.index.get_level_values("site").unique():
        rows = frame[frame["site"] == site]
        harmonized = study.harmonization.get(site)
        flows.append(
            SiteFlow(
                site=site,
                patients=harmonized.patients if harmonized else None,
                table=table.loc[site],
                messages=len(rows),
                bytes_out=int(rows["reply_bytes"].sum()),
                largest_reply=int(rows["reply_bytes"].max()),
            )
        )
    return flows


def _fit_summary(study: Study, fit: FitRecord) -> FitSummary:
    result = fit.result
    reference = study.fit(fit.reference).result if fit.reference else None
    rows = []
    for term in result.ordered_terms:
        coef = result.params[term]
        ref = reference is not None and term in reference.params
        rows.append(
            CoefficientRow(
                term=term,
                coef=coef,
                bse=result.bse.get(term),
                lower=result.conf_int["lower"].get(term),
                upper=result.conf_int["upper"].get(term),
                pvalue=result.pvalues.get(term),
                reference_coef=reference.params[term] if ref else None,
                reference_lower=reference.conf_int["lower"].get(term) if ref else None,
                reference_upper=reference.conf_int["upper"].get(term) if ref else None,
                noise_share=result.noise_share.get(term),
            )
        )
    comparable = [
        r
        for r in rows
        if r.reference_coef is not None
        and None not in (r.lower, r.upper, r.reference_lower, r.reference_upper)
    ]
    plot = None
    if comparable:
        plot = coefficient_comparison(
            [term_label(r.term) for r in comparable],
            [(r.coef, r.lower, r.upper) for r in comparable],
            [(r.reference_coef, r.reference_lower, r.reference_upper) for r in comparable],
            (fit.name, fit.reference),
        )
    return FitSummary(
        name=fit.name,
        description=fit.description,
        model=result.model,
        private=result.privacy is not None,
        reference=fit.reference,
        alpha=result.alpha,
        n_obs=dict(result.provenance.n_obs),
        n_events=dict(result.n_events),
        rounds=result.provenance.rounds,
        messages=result.provenance.messages,
        converged=result.converged,
        notes=tuple(result.notes),
        rows=tuple(rows),
        plot=plot,
        interval_method=result.interval_method,
        utility_warnings=tuple(result.utility_warnings),
        events_used=result.events_used,
        counts_noisy=result.privacy is not None
        and any(s.unit == "patient" for s in result.privacy.scopes),
    )
