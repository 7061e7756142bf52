"""Exact logistic regression over vertically partitioned, linked data.

One site, the registry, holds the 0/1 outcome; each hospital holds the covariates of the
patients it linked with the registry (its own linkage: :mod:`fedstats.site.linked_rows`).
The only cross-site quantity of the logistic likelihood is ``X^T y``; each hospital gets
its own under the registry's fresh Paillier key, masked, once
(:mod:`fedstats.site.handlers.vertical`), and then answers Newton rounds as a site of a
horizontal fit does: score ``X_h^T y_h - X_h^T mu_h``, information ``X_h^T W_h X_h`` and
log-likelihood, summed over hospitals, on the path rule of logistic regression (every
hospital re-derives each point from the previous round's signed replies). The estimate is
the maximum-likelihood estimate on the joined rows (statsmodels GLM Binomial on them).

What is protected: no per-patient value crosses in the clear; the coordinator (treated as
malicious) sees ciphertexts, masked residues uniform in ``Z_n``, ``X^T y`` through the
first round's score (as in the horizontal fit) and the Newton sums. The registry decrypts
once per key, one value per design column, only sums a hospital signed. Sites are assumed
semi-honest: a hospital running modified software could send a column that isolates one
patient and learn that patient's outcome from ``X^T y``; no check at the registry can see
it. Not supported: Cox models (ordering patients by the registry's event times would leak
them to the hospital) and covariates split over several sites for the same patient (the
linear predictor would be a sum across sites, and ``expit`` of it needs a secure sigmoid,
i.e. generic secure computation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from fedstats.contract.design import (
    DesignSpec,
    Level,
    design_columns,
    normalise_level,
    parse_formula,
    union_levels,
)
from fedstats.contract.newton import (
    DECREMENT_TOL,
    inverse_information,
)
from fedstats.contract.tasks import vertical as wire
from fedstats.errors import FormulaError, StudyConfigurationError
from fedstats.models.agree import SiteCounts, agreed_kinds
from fedstats.models.exact_newton import exact_newton_rounds
from fedstats.models.federation import Federation
from fedstats.models.results import LogisticRegressionResults, Provenance


class VerticalLogisticRegression:
    """Logistic regression whose outcome is at one site and covariates at others.

    Parameters
    ----------
    formula:
        Wilkinson formula (``"disease ~ age + sex + C(cp)"``) or an agreed
        :class:`~fedstats.DesignSpec`; the outcome's variables are read at ``outcome_site``,
        the covariates at each of ``covariate_sites``.
    outcome_site:
        The registry: the site holding the 0/1 outcome.
    covariate_sites:
        The hospitals, each holding every covariate of its linked patients (a patient's
        covariates are not split over sites).
    linkage_id:
        The accepted linkage between the registry and the hospital: one id, or one per
        hospital (each hospital is linked to the registry for its own patients).
    levels:
        Categorical levels fixed by the analyst; others are the hospitals' union.
    maxiter, tol:
        Newton rounds allowed, and the Newton decrement below which the fit has converged.

    Examples
    --------
    >>> model = VerticalLogisticRegression(
    ...     "disease ~ age + sex", outcome_site="registry", covariate_sites=["hospital"],
    ...     linkage_id="L1")                                    # doctest: +SKIP
    >>> model.fit(federation).summary()                        # doctest: +SKIP
    """

    def __init__(
        self,
        formula: str | DesignSpec,
        *,
        outcome_site: str,
        covariate_sites: Sequence[str],
        linkage_id: str | Mapping[str, str],
        levels: Mapping[str, Sequence[Level]] | None = None,
        maxiter: int = 50,
        tol: float = DECREMENT_TOL,
    ) -> None:
        if not isinstance(formula, str | DesignSpec):
            raise FormulaError(f"formula must be a string or a DesignSpec, got {formula!r}")
        hospitals = list(covariate_sites) if not isinstance(covariate_sites, str) else []
        if not hospitals or len(set(hospitals)) != len(hospitals) or outcome_site in hospitals:
            raise StudyConfigurationError(
                "covariate_sites must list distinct sites, not the outcome site"
            )
        if isinstance(linkage_id, str):
            if len(hospitals) != 1:
                raise StudyConfigurationError(
                    "with several covariate sites give one linkage id per site: "
                    "linkage_id={site: id, ...}"
                )
            linkages = {hospitals[0]: linkage_id}
        else:
            linkages = dict(linkage_id)
        if set(linkages) != set(hospitals) or not all(
            isinstance(v, str) for v in linkages.values()
        ):
            raise StudyConfigurationError("linkage_id must give one linkage id per covariate site")
        if type(maxiter) is not int or maxiter < 1:
            raise StudyConfigurationError(f"maxiter must be a positive integer, got {maxiter!r}")
        if not 0 < tol < 1:
            raise StudyConfigurationError(f"tol must be in (0, 1), got {tol!r}")
        self.formula = formula if isinstance(formula, str) else formula.formula
        self.design = formula if isinstance(formula, DesignSpec) else None
        self.outcome_site = outcome_site
        self.covariate_sites = tuple(hospitals)
        self.linkages = linkages
        self.levels = dict(levels or {})
        self.maxiter = maxiter
        self.tol = tol

    def __repr__(self) -> str:
        return (
            f"VerticalLogisticRegression({self.formula!r}, outcome_site={self.outcome_site!r}, "
            f"covariate_sites={list(self.covariate_sites)})"
        )

    # ------------------------------------------------------------------ design

    def agree(self, federation: Federation, analysis: str) -> DesignSpec:
        """The design: covariates' kinds and levels from the hospitals, the outcome checked at
        the registry when it is prepared (each site describes only its own columns)."""
        if self.design is not None:
            return self.design
        parsed = parse_formula(self.formula)
        fixed = {k: tuple(normalise_level(v) for v in vals) for k, vals in self.levels.items()}
        unknown = sorted(set(fixed) - parsed.covariates)
        if unknown:
            raise FormulaError(f"levels were given for {unknown}, which the formula does not use")
        covariates = sorted(parsed.covariates)
        replies = federation.request(
            "describe",
            {"variables": covariates, "levels_for": sorted(parsed.wrapped - set(fixed)),
             "levels_known": sorted(fixed), "list_levels": True},
            analysis=analysis, sites=self.covariate_sites,
        )  # fmt: skip
        kinds = agreed_kinds(replies, covariates)
        agreed: dict[str, tuple[Level, ...]] = {}
        for var in covariates:
            if var in fixed:
                agreed[var] = fixed[var]
            elif kinds[var] == "categorical" or var in parsed.wrapped:
                agreed[var] = union_levels({s: r[f"{var}.levels"] for s, r in replies.items()}, var)
        columns = list(design_columns(parsed, covariates, agreed).columns)
        if not columns:
            raise FormulaError(f"the formula {self.formula!r} has no design columns")
        return DesignSpec(
            formula=self.formula,
            outcome=parsed.outcome,
            variables=tuple(sorted(parsed.outcome_variables | parsed.covariates)),
            levels=agreed,
            columns=tuple(columns),
            site_intercepts=False,
            sites=federation.sites,
            offset=None,
            missing="raise",
            outcome_kind="binary",
        )

    # ------------------------------------------------------------------ fit

    def fit(self, federation: Federation) -> LogisticRegressionResults:
        """Agree on the design, have each hospital obtain its ``X^T y`` under the registry's
        key (unless it holds it already), then take Newton rounds over the hospitals."""
        if not isinstance(federation, Federation):
            raise StudyConfigurationError(
                f"fit() needs a fedstats.Federation, got {type(federation).__name__}"
            )
        missing = sorted({self.outcome_site, *self.covariate_sites} - set(federation.sites))
        if missing:
            raise StudyConfigurationError(f"sites {missing} are not in the federation")
        started = datetime.now(UTC)
        analysis = federation.new_analysis("vertical-logistic")
        spec = self.agree(federation, analysis)
        design = spec.to_wire()
        counts = self._prepared(federation, design, analysis)
        for hospital in self.covariate_sites:
            if not counts[hospital]["ready"]:
                self.encrypted_products(federation, design, hospital, counts, analysis)
        return self._newton(federation, spec, analysis, counts, started)

    def _prepared(
        self, federation: Federation, design: dict, analysis: str
    ) -> dict[str, dict[str, Any]]:
        """Each site's linked rows, checked: pairs per hospital (the registry's count of the
        same linkage must agree), events per linkage, whether ``X^T y`` is held."""
        counts: dict[str, dict[str, Any]] = {}
        for hospital, linkage in self.linkages.items():
            base = {"design": design, "linkage": linkage}
            registry = federation.request(
                wire.PREPARE, {**base, "role": wire.OUTCOME}, analysis=analysis,
                sites=[self.outcome_site],
            )[self.outcome_site]  # fmt: skip
            site = federation.request(
                wire.PREPARE, {**base, "role": wire.COVARIATES}, analysis=analysis,
                sites=[hospital],
            )[hospital]  # fmt: skip
            if int(site["n_pairs"]) != int(registry["n_pairs"]):
                raise StudyConfigurationError(
                    f"linkage {linkage!r}: {hospital!r} and {self.outcome_site!r} hold different "
                    "numbers of linked pairs; both must accept the same linkage"
                )
            counts[hospital] = {"n_pairs": int(site["n_pairs"]), "ready": bool(site["ready"]),
                                "n_events": int(registry["n_events"])}  # fmt: skip
        return counts

    def encrypted_products(
        self,
        federation: Federation,
        design: dict,
        hospital: str,
        counts: Mapping[str, Mapping[str, Any]],
        analysis: str,
    ) -> None:
        """The one-time step for one hospital: the registry's encrypted outcome, the
        hospital's masked sums, the registry's one decryption, the hospital's unmasking.
        The coordinator relays each signed reply as it came."""
        registry, linkage = self.outcome_site, self.linkages[hospital]
        base = {"design": design, "linkage": linkage}

        def ask(site: str, task: str, args: dict) -> dict:
            return federation.request(task, {**base, **args}, analysis=analysis, sites=[site])[site]

        pairs = counts[hospital]["n_pairs"]
        encrypted = ask(registry, wire.ENCRYPT, {"n_pairs": pairs})
        masked = ask(
            hospital, wire.MASKED, {"n_pairs": pairs, "registry": registry, "encrypted": encrypted}
        )
        decrypted = ask(
            registry,
            wire.DECRYPT,
            {"hospital": hospital, "masked": masked, "public_key": encrypted["public_key"]},
        )
        ask(hospital, wire.UNMASK, {"registry": registry, "decrypted": decrypted})

    def _newton(
        self,
        federation: Federation,
        spec: DesignSpec,
        analysis: str,
        counts: Mapping[str, Mapping[str, Any]],
        started: datetime,
    ) -> LogisticRegressionResults:
        """Newton rounds over the hospitals on the verified path (as
        :class:`fedstats.LogisticRegression`'s exact fit takes them)."""
        hospitals = federation.subset(list(self.covariate_sites))
        names = list(spec.columns)
        request = {"design": spec.to_wire(), "linkages": dict(sorted(self.linkages.items()))}
        ended = exact_newton_rounds(
            hospitals,
            wire.SUMMARIES_TASK,
            request,
            names,
            analysis=analysis,
            maxiter=self.maxiter,
            tol=self.tol,
        )
        notes = ended.notes
        site_counts = SiteCounts(
            n_obs={h: counts[h]["n_pairs"] for h in self.covariate_sites},
            n_dropped={h: 0 for h in self.covariate_sites},
            n_events={h: counts[h]["n_events"] for h in self.covariate_sites},
        )
        provenance = Provenance.of_fit(federation, analysis, site_counts, ended.rounds, started)
        notes.append(
            f"vertical fit: outcome at {self.outcome_site!r}, covariates at "
            f"{list(self.covariate_sites)}; X^T y under the registry's Paillier key"
        )
        result = LogisticRegressionResults(
            names=names,
            params=ended.beta,
            cov=inverse_information(ended.hessian),
            llf=ended.llf,
            converged=ended.converged,
            iterations=ended.rounds,
            provenance=provenance,
            notes=notes,
            n_events=site_counts.n_events,
            model=self,
        )
        result.design = spec.to_wire()
        return result
