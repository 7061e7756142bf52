"""The first page's verdict: one plain paragraph on what a study released and at what cost.

NIST SP 800-226 (2025) and "Expose your epsilons!" (Dwork, Kohli & Mulligan
2019) ask that a deployment state its claim in one paragraph a non-specialist
can read: what was released, under which guarantee (unit of privacy, ε, δ)
and whether the budgets held. :func:`verdict` writes that paragraph from the
report model, which holds only recorded facts: the ledgers' scopes (spent
and budget ε), the fits and curves (private or exact, noise-dominated), the
sites and the configured noise seed. Nothing in it is fixed text about a
particular study.
"""

from __future__ import annotations

from collections.abc import Iterable

from reports.analyses import unaccounted
from reports.formatting import format_delta, format_epsilon
from reports.model import ComplianceReport, ScopeSummary, Verdict

LEVEL_WORDS = {
    "patient": ("Record-level", "each of its patients"),
    "site": ("Client-level", "each site's participation"),
}


def join_words(words: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    words = list(words)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def _over(scope: ScopeSummary) -> bool:
    return scope.epsilon_rdp > scope.budget_epsilon


def verdict(report: ComplianceReport) -> Verdict:
    """The verdict paragraph of ``report`` (see the module docstring)."""
    sentences = [_released(report), *_accounted(report)]
    sentences += _guarantees(report.scopes)
    exact = [result.name for result in report.released if not result.private]
    if exact:
        sentences.append(
            f"The exact results ({join_words(exact)}) carry no differential-privacy guarantee: "
            "they are protected only by the sites' disclosure control (section 5)."
        )
    over = tuple(s.owner for s in report.scopes if _over(s))
    within = tuple(s.owner for s in report.scopes if not _over(s))
    if not report.scopes:
        statement = report.configuration.get("ledgers")
        sentences.append(
            "No privacy ledger is recorded with this study, so whether each site stayed within "
            "its budget cannot be read here."
            + (f" {statement}" if isinstance(statement, str) else "")
        )
    elif over:
        sentences.append(
            f"Not every site stayed within its budget: {_spent_of_budget(report.scopes, over)} "
            "exceeded it (ε spent of ε budget). "
            + (f"The others ({join_words(within)}) stayed within theirs." if within else "")
        )
    else:
        sentences.append(
            "Every scope stayed within its budget (ε spent of ε budget: "
            f"{_spent_of_budget(report.scopes, within)})."
        )
    sentences += _ledger_trust(report)
    sentences += _unverified_paths(report)
    if report.noise_seed is not None:
        sentences.append(
            f"The noise was drawn from a fixed seed ({report.noise_seed}): it can be reproduced, "
            "so this run gives no privacy in practice (section 9)."
        )
    swamped = [f.name for f in report.fits if f.noise_dominated]
    swamped += [c.name for c in report.curves if c.noise_dominated]
    if swamped:
        sentences.append(
            f"The privacy noise dominates {join_words(swamped)}: read "
            f"{'its' if len(swamped) == 1 else 'their'} intervals, not "
            f"{'its' if len(swamped) == 1 else 'their'} point estimates (box below and section 8)."
        )
    return Verdict(" ".join(s.strip() for s in sentences), within, over, bool(report.scopes))


def _ledger_trust(report: ComplianceReport) -> list[str]:
    """Plain sentences when a ledger does not verify, or does not extend a chain head the
    coordinator recorded from a site's replies (:mod:`reports.heads`)."""
    sentences = []
    broken = [ledger.file for ledger in report.ledgers if not ledger.ok]
    if broken:
        sentences.append(
            f"WARNING: the privacy ledger{'s' if len(broken) > 1 else ''} {join_words(broken)} "
            f"{'do' if len(broken) > 1 else 'does'} not verify: what it records was changed "
            "outside fedstats, so its budgets cannot be trusted (section 10 lists each problem)."
        )
    rewritten = [h for h in report.ledger_heads if h.state == "rewritten"]
    if rewritten:
        owners = join_words(sorted({h.owner for h in rewritten}))
        sentences.append(
            f"WARNING: the privacy ledger of {owners} was rewritten after it released: it does "
            "not extend the chain head recorded with its replies "
            f"({'; '.join(h.problem or '' for h in rewritten)}). Charges made for this study "
            "are missing from it, so the budget it shows cannot be trusted (section 10)."
        )
    return sentences


def _unverified_paths(report: ComplianceReport) -> list[str]:
    """A warning when a site answered exact requests without verifying their paths, as its
    fingerprint reply recorded (section 5): the coordinator chose the coefficients of its
    exact answers, which a malicious one can turn into rows."""
    unverified = [r.site for r in report.site_rules if r.verifies_paths is False]
    if not unverified:
        return []
    which = join_words(unverified)
    return [
        f"WARNING: {which} did not verify paths: {'its' if len(unverified) == 1 else 'their'} "
        "exact answers to iterative fits were given at coefficients the coordinator chose, "
        "not only at points an honest fit of the sites' data reaches, so the approved "
        "protocol does not bound what a malicious coordinator could learn from them "
        "(section 5)."
    ]


def _released(report: ComplianceReport) -> str:
    sites = _sites(report)
    kinds: dict[str, list[tuple[str, bool]]] = {}
    for result in report.released:
        kinds.setdefault(result.kind, []).append((result.name, result.private))
    released = join_words(_counted(named, kind) for kind, named in kinds.items())
    released = released or "no recorded result"
    source = f"{len(sites)} sites ({join_words(sites)})" if sites else "sites not recorded"
    return f"This study released {released}, computed from {source}; no patient row left a site."


def _counted(named: list[tuple[str, bool]], noun: str) -> str:
    """``3 fitted models (exact: a; under differential privacy: b and c)``;
    ``1 exact survival curve (km)``; ``2 trained networks under differential privacy (a and b)``.
    """
    if not named:
        return ""
    total = len(named)
    plural = noun if total == 1 or noun.endswith("s") else f"{noun}s"
    private = [name for name, is_private in named if is_private]
    exact = [name for name, is_private in named if not is_private]
    if not exact:
        return f"{total} {plural} under differential privacy ({join_words(private)})"
    if not private:
        return f"{total} exact {plural} ({join_words(exact)})"
    return (
        f"{total} {plural} (exact: {join_words(exact)}; under differential privacy: "
        f"{join_words(private)})"
    )


def _accounted(report: ComplianceReport) -> list[str]:
    """Whether every analysis whose answers left a site belongs to a recorded result
    (:mod:`reports.analyses`); the ones that do not are named with a warning."""
    if not report.analyses:
        return []
    missing = unaccounted(report.analyses)
    if not missing:
        answered = sum(1 for row in report.analyses if row.answered)
        return [
            f"Every one of the {answered} analyses whose answers left the sites belongs to one "
            "of these results (section 6 ties each to its result)."
        ]
    labels = join_words(
        f"{row.analysis} ({', '.join(row.tasks)}; {row.answered} answers from "
        f"{join_words(row.sites)})"
        for row in missing
    )
    one = len(missing) == 1
    return [
        f"WARNING: answers to {labels} left the sites, but no recorded result names "
        f"{'it' if one else 'them'}: what {'it' if one else 'they'} released is not shown in "
        "section 8 (section 6 lists every analysis)."
    ]


def _sites(report: ComplianceReport) -> list[str]:
    names = [h.site for h in report.harmonization]
    names += [r.site for r in report.site_rules]
    names += [site for f in report.fits for site in f.n_obs]
    names += [site for r in report.releases for site in r.sites]
    return sorted(dict.fromkeys(names))


def _guarantees(scopes: tuple[ScopeSummary, ...]) -> list[str]:
    sentences = []
    for unit, (level, protected) in LEVEL_WORDS.items():
        groups: dict[tuple[str, str], list[str]] = {}
        for scope in scopes:
            if scope.unit == unit:
                key = (format_epsilon(scope.epsilon_rdp), format_delta(scope.delta))
                groups.setdefault(key, []).append(scope.owner)
        for (epsilon, delta), owners in groups.items():
            who = f"the {owners[0]}" if owners == ["coordinator"] else owners[0]
            who = who if len(owners) == 1 else f"each of {join_words(owners)}"
            sentences.append(
                f"{level} guarantee: {who} protected {protected} with (ε = {epsilon}, "
                f"δ = {delta})-differential privacy over the whole study (counted by the Rényi-DP "
                "accountant; see the terms below)."
            )
    return sentences


def _spent_of_budget(scopes: tuple[ScopeSummary, ...], owners: tuple[str, ...]) -> str:
    groups: dict[tuple[str, str], list[str]] = {}
    for scope in scopes:
        if scope.owner in owners:
            key = (format_epsilon(scope.epsilon_rdp), format_epsilon(scope.budget_epsilon))
            groups.setdefault(key, []).append(scope.owner)
    return "; ".join(
        f"{join_words(names)} {spent} of {budget}" for (spent, budget), names in groups.items()
    )
