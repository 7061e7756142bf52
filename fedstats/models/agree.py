"""Coordinator side of the design: agree on variables, levels and columns with every site."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from fedstats.contract.design import (
    SITE_COLUMN,
    DesignLayout,
    DesignSpec,
    Level,
    ParsedFormula,
    counting_outcome,
    design_columns,
    is_survival,
    normalise_level,
    parse_formula,
    survival_outcome,
    union_levels,
)
from fedstats.contract.dp_request import DpRequest
from fedstats.errors import FormulaError, InconsistentColumnError, StudyConfigurationError
from fedstats.models.federation import Federation


@dataclass(frozen=True)
class SiteCounts:
    """What each site reported after building the agreed design.

    Under record-level privacy the counts are Gaussian-noised (``noisy``),
    released and charged by each site like any other statistic.
    """

    n_obs: dict[str, float]
    n_dropped: dict[str, float]
    n_events: dict[str, float]
    noisy: bool = False

    def dropped_note(self) -> str | None:
        """The note a fit carries when sites dropped incomplete rows, else None."""
        if not any(self.n_dropped.values()):
            return None
        dropped = ", ".join(f"{s}={n}" for s, n in self.n_dropped.items())
        return f"complete cases only; rows dropped per site: {dropped}"


@dataclass(frozen=True)
class Agreement:
    """The agreed design, its term layout, and the sites' counts."""

    spec: DesignSpec
    layout: DesignLayout
    counts: SiteCounts


class DesignOptions(TypedDict, total=False):
    """The options of :func:`agreed_design` (and so of :func:`agree_design`) beyond the formula."""

    levels: Mapping[str, Sequence[Level]] | None
    site_intercepts: bool
    offset: str | None
    missing: str
    outcome_kind: str
    strata: Sequence[str]
    weights: str | None
    exposure: str | None


def agree_design(
    federation: Federation,
    formula: str,
    *,
    analysis: str,
    dp: DpRequest | None = None,
    **options: Unpack[DesignOptions],
) -> Agreement:
    """Agree on the design with every site, then have each site build and validate it.

    Two requests per site: ``describe`` (variable kinds and levels,
    :func:`agreed_design`, which takes the ``options``) and ``prepare`` (build the
    agreed design; counts). Levels fixed by the analyst in ``levels`` are used as
    given and not asked for. Under privacy (``dp``) sites list no levels — every
    categorical covariate's levels must be fixed by the study — and the counts are a
    charged, noisy release.

    A survival design (``outcome_kind="survival"``) has the outcome
    ``Surv(time, event)``, no intercept (the baseline hazard takes its place:
    categorical covariates keep their reference coding, then the intercept
    column is dropped) and optional ``strata`` columns. ``weights`` names a
    numeric column of frequency weights (:mod:`fedstats.site.weights`);
    ``exposure`` one of positive exposures whose log joins the offset.
    """
    spec, layout = agreed_design(federation, formula, analysis=analysis, dp=dp, **options)
    return Agreement(spec=spec, layout=layout, counts=_prepared(federation, spec, dp, analysis))


def agreed_design(
    federation: Federation,
    formula: str,
    *,
    analysis: str,
    levels: Mapping[str, Sequence[Level]] | None = None,
    site_intercepts: bool = False,
    offset: str | None = None,
    missing: str = "raise",
    dp: DpRequest | None = None,
    outcome_kind: str = "binary",
    strata: Sequence[str] = (),
    weights: str | None = None,
    exposure: str | None = None,
) -> tuple[DesignSpec, DesignLayout]:
    """The design agreed from the sites' ``describe`` replies, before any site builds it:
    the first half of :func:`agree_design` (a model whose sites validate the design in
    their own task, as Fine–Gray's, stops here)."""
    if missing not in ("raise", "drop"):
        raise StudyConfigurationError(f"missing must be 'raise' or 'drop', got {missing!r}")
    strata = tuple(strata)
    parsed = _checked_formula(formula, outcome_kind, strata, site_intercepts, offset)
    if weights is not None and dp is not None:
        raise StudyConfigurationError(
            "a differentially private fit takes no frequency weights: its noise is calibrated "
            "to rows that count once"
        )
    for role in (weights, exposure):
        if role is None:
            continue
        if not isinstance(role, str) or not role:
            raise StudyConfigurationError(f"weights and exposure name columns, got {role!r}")
        roles = parsed.outcome_variables | parsed.covariates | set(strata)
        if role in roles or [offset, weights, exposure].count(role) > 1:
            raise FormulaError(f"the column {role!r} has two roles in the model")
    fixed = {k: tuple(normalise_level(v) for v in vals) for k, vals in (levels or {}).items()}
    unknown_fixed = sorted(set(fixed) - parsed.covariates)
    if unknown_fixed:
        raise FormulaError(f"levels were given for {unknown_fixed}, which the formula does not use")
    replies, kinds = _described(
        federation, parsed, fixed, offset, strata, dp, analysis, (weights, exposure)
    )
    agreed = _levels(parsed, fixed, kinds, replies)
    overlap = sorted(parsed.outcome_variables & parsed.covariates)
    if overlap:
        raise FormulaError(f"{overlap} appear on both sides of the formula")
    layout = design_columns(parsed, sorted(parsed.covariates), agreed)
    columns = _columns(layout, formula, outcome_kind, site_intercepts, federation.sites)
    spec = DesignSpec(
        formula=formula,
        outcome=parsed.outcome,
        variables=tuple(sorted(parsed.outcome_variables | parsed.covariates)),
        levels=agreed,
        columns=tuple(columns),
        site_intercepts=site_intercepts,
        sites=federation.sites,
        offset=offset,
        missing=missing,
        outcome_kind=outcome_kind,
        strata=strata,
        weights=weights,
        exposure=exposure,
    )
    return spec, layout


def _checked_formula(
    formula: str,
    outcome_kind: str,
    strata: tuple[str, ...],
    site_intercepts: bool,
    offset: str | None,
) -> ParsedFormula:
    """The parsed formula, refused when its outcome, strata or intercepts do not fit the model."""
    parsed = parse_formula(formula)
    if outcome_kind == "survival":
        if not is_survival(parsed.outcome):
            raise FormulaError(
                "a survival model's outcome is Surv(time, event) or Surv(start, stop, event), "
                f"got {parsed.outcome!r}"
            )
        if site_intercepts or offset:
            raise FormulaError("survival models take neither site intercepts nor an offset")
        clash = sorted(set(strata) & (parsed.outcome_variables | parsed.covariates))
        if clash:
            raise FormulaError(f"strata {clash} may not also appear in the formula")
    elif strata:
        raise StudyConfigurationError("only survival models have strata")
    elif survival_outcome(parsed.outcome) is not None:
        raise FormulaError(f"{parsed.outcome} is a survival outcome: fit it with CoxPH")
    return parsed


def _described(
    federation: Federation,
    parsed: ParsedFormula,
    fixed: Mapping[str, tuple[Level, ...]],
    offset: str | None,
    strata: tuple[str, ...],
    dp: DpRequest | None,
    analysis: str,
    numeric: tuple[str | None, ...] = (),
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each site's ``describe`` reply and the kinds of the variables the sites agree on.

    Under privacy sites list no levels, so every categorical covariate's
    levels must be fixed by the study.
    """
    wrapped = set(parsed.wrapped)
    numeric_roles = {v for v in (offset, *numeric) if v}
    asked = sorted(parsed.outcome_variables | parsed.covariates | numeric_roles | set(strata))
    survival = survival_outcome(parsed.outcome)
    counting = counting_outcome(parsed.outcome)
    # follow-up times have no levels to list
    times = {survival[0]} if survival else set(counting[:2]) if counting else set()
    replies = federation.request(
        "describe",
        {
            "variables": asked,
            "levels_for": sorted(wrapped - set(fixed)),
            # these stay at sites
            "levels_known": sorted(set(fixed) | set(strata) | times | numeric_roles),
            "list_levels": dp is None,
        },
        analysis=analysis,
    )
    kinds = agreed_kinds(replies, asked)
    for time in times:
        if kinds[time] != "numeric":
            raise FormulaError(
                f"the follow-up time {time!r} of {parsed.outcome} is not numeric at the sites "
                "(dates or text?): it must be the numeric follow-up from entry to the event or "
                "censoring, e.g. in days. Convert it during harmonisation, e.g. "
                f"frame[{time!r}] = (pd.to_datetime(frame['end']) - "
                "pd.to_datetime(frame['start'])).dt.days"
            )
    if dp is not None:
        undeclared = sorted(
            v
            for v in parsed.covariates
            if v not in fixed and (kinds[v] == "categorical" or v in wrapped)
        )
        if undeclared:
            raise FormulaError(
                f"under differential privacy the levels of {undeclared} must be declared with "
                "levels={...} (from the study specification): sites do not release levels "
                "they would have to pay for"
            )
    if offset and kinds[offset] != "numeric":
        raise FormulaError(f"the offset {offset!r} must be a numeric column")
    for column in numeric:
        if column and kinds[column] != "numeric":
            raise FormulaError(f"the column {column!r} must be numeric (weights or exposure)")
    return replies, kinds


def _levels(
    parsed: ParsedFormula,
    fixed: Mapping[str, tuple[Level, ...]],
    kinds: Mapping[str, str],
    replies: Mapping[str, Mapping[str, Any]],
) -> dict[str, tuple[Level, ...]]:
    """Each categorical covariate's levels: as the study fixed them, else the sites' union."""
    agreed: dict[str, tuple[Level, ...]] = {}
    for var in sorted(parsed.covariates):
        if var in fixed:
            agreed[var] = fixed[var]
        elif kinds[var] == "categorical" or var in parsed.wrapped:
            per_site = {site: reply[f"{var}.levels"] for site, reply in replies.items()}
            agreed[var] = union_levels(per_site, var)
    return agreed


def _columns(
    layout: DesignLayout,
    formula: str,
    outcome_kind: str,
    site_intercepts: bool,
    sites: Sequence[str],
) -> list[str]:
    """The design's columns: no intercept for a Cox model (the baseline hazard), one intercept
    per site for ``site_intercepts``."""
    columns = list(layout.columns)
    if outcome_kind == "survival":
        if "Intercept" not in columns:
            raise FormulaError(
                "a Cox model's baseline hazard replaces the intercept; keep the formula's "
                "intercept (do not write '- 1' or '0 +') so categorical covariates keep a "
                "reference level"
            )
        columns.remove("Intercept")
    if not columns:
        raise FormulaError(f"the formula {formula!r} has no design columns")
    if site_intercepts:
        if "Intercept" not in columns:
            raise FormulaError(
                "site_intercepts=True replaces the formula's intercept with one per site; "
                "keep the intercept in the formula (do not write '- 1' or '0 +')"
            )
        columns = [SITE_COLUMN.format(s) for s in sites] + [c for c in columns if c != "Intercept"]
    return columns


def _prepared(
    federation: Federation, spec: DesignSpec, dp: DpRequest | None, analysis: str
) -> SiteCounts:
    """Each site builds and validates the agreed design (``prepare``) and counts its rows:
    exact, or under privacy a charged noisy release clamped to ``0 <= events <= patients``
    (post-processing, free of privacy cost)."""
    prepare_args: dict = {"design": spec.to_wire()}
    if dp is not None:
        prepare_args["dp"] = dp.to_args()
    counts = federation.request("prepare", prepare_args, analysis=analysis)
    if dp is None:
        return SiteCounts(
            n_obs={s: int(r["n_obs"]) for s, r in counts.items()},
            n_dropped={s: int(r["n_dropped"]) for s, r in counts.items()},
            n_events={s: int(r["n_events"]) for s, r in counts.items()},
        )
    n_obs = {s: max(0.0, float(r["n_obs"])) for s, r in counts.items()}
    return SiteCounts(
        n_obs=n_obs,
        n_dropped={s: max(0.0, float(r["n_dropped"])) for s, r in counts.items()},
        n_events={s: min(max(0.0, float(r["n_events"])), n_obs[s]) for s, r in counts.items()},
        noisy=True,
    )


def agreed_levels(federation: Federation, variable: str, analysis: str) -> tuple[Level, ...]:
    """The union of one categorical column's levels over the sites (each site's level checks
    apply; :func:`fedstats.contract.design.union_levels`)."""
    replies = federation.request(
        "describe",
        {"variables": [variable], "levels_for": [variable], "levels_known": [],
         "list_levels": True},
        analysis=analysis,
    )  # fmt: skip
    agreed_kinds(replies, [variable])
    return union_levels({s: r[f"{variable}.levels"] for s, r in replies.items()}, variable)


def agreed_kinds(replies: Mapping[str, Mapping], variables: Sequence[str]) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for var in variables:
        seen = {site: reply[f"{var}.kind"] for site, reply in replies.items()}
        distinct = set(seen.values())
        if not distinct <= {"numeric", "categorical"}:
            raise InconsistentColumnError(
                site=next(iter(seen)), column=var, reason=f"has an unknown kind {sorted(distinct)}"
            )
        if len(distinct) > 1:
            odd = next(s for s, k in seen.items() if k != next(iter(seen.values())))
            raise InconsistentColumnError(
                site=odd,
                column=var,
                reason=f"is {seen[odd]} here but {seen[next(iter(seen))]} at "
                f"{next(iter(seen))!r}; harmonise its type across sites",
            )
        kinds[var] = distinct.pop()
    return kinds
