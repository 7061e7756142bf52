"""The design a study agrees on before any fit: formula, levels and design columns.

A site must never decide its design columns by itself: if one site lacked a
level, its dummy coding would silently differ from the others'. So the
coordinator first asks every site for the kind of each variable and the
levels of each categorical one (refused for identifier-like columns, see
:func:`fedstats.site.disclosure.check_levels`), takes their union (or the levels
the analyst fixed), derives the design columns from the formula on a
synthetic skeleton frame that holds no patient data, and sends the resulting
:class:`DesignSpec` with every request. Each site builds exactly these
columns or refuses with a typed error.

Both sides read the spec with this module: the coordinator to agree on it
(:mod:`fedstats.models.agree`), each site to build its rows' design
(:mod:`fedstats.site.handlers.design`), after checking the spec against its own
parse of the formula (:func:`fedstats.site.formula_check.checked_formula`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from formulaic import Formula, model_matrix
from formulaic.errors import FormulaicError
from formulaic.parser.types import Term

from fedstats.contract.formula_grammar import Factor, parse_factor, plain_message
from fedstats.contract.paths import SITE_COLUMN
from fedstats.errors import (
    FormulaError,
    InconsistentColumnError,
    UnsafeTermError,
)

Level = int | float | str


WIRE_FIELDS = (
    "formula",
    "outcome",
    "variables",
    "levels",
    "columns",
    "site_intercepts",
    "sites",
    "offset",
    "missing",
    "outcome_kind",
    "strata",
    "weights",
    "exposure",
)
"""The fields of a design on the wire (:meth:`DesignSpec.to_wire`), in order."""

OUTCOME_KINDS = ("binary", "survival", "count", "continuous")
_SURV = re.compile(r"^\s*Surv\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


_NAME = r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*"
_SURV_COUNTING = re.compile(rf"^\s*Surv\({_NAME},{_NAME},{_NAME}\)\s*$")


def survival_outcome(outcome: str) -> tuple[str, str] | None:
    """``(time, event)`` of a ``Surv(time, event)`` outcome, else ``None``."""
    match = _SURV.match(outcome)
    return (match.group(1), match.group(2)) if match else None


def counting_outcome(outcome: str) -> tuple[str, str, str] | None:
    """``(start, stop, event)`` of a counting-process ``Surv(start, stop, event)`` outcome.

    Each row is an interval ``(start, stop]`` of one patient's follow-up with
    covariates constant on it, ending in an event or not (Andersen & Gill,
    *Annals of Statistics* 1982; R's ``Surv(start, stop, event)``): several
    rows per patient carry time-varying covariates, and ``start > 0`` is
    delayed entry (left truncation). ``None`` for any other outcome.
    """
    match = _SURV_COUNTING.match(outcome)
    return (match.group(1), match.group(2), match.group(3)) if match else None


def is_survival(outcome: str) -> bool:
    """Whether ``outcome`` is ``Surv(time, event)`` or ``Surv(start, stop, event)``."""
    return survival_outcome(outcome) is not None or counting_outcome(outcome) is not None


@dataclass(frozen=True)
class DesignSpec:
    """Everything a site needs to build the agreed design matrix.

    Attributes
    ----------
    formula: the model formula, Wilkinson notation as read by formulaic.
    outcome: the formula's left-hand side.
    variables: the data columns the formula reads (outcome and covariates).
    levels: agreed categorical levels, by variable.
    columns: the agreed design columns, in order.
    site_intercepts: one intercept column per site instead of a shared one.
    sites: the federation's sites, in order (names the site-intercept columns).
    offset: name of a numeric offset column, or ``None``.
    missing: ``"raise"`` (refuse rows with missing values) or ``"drop"``
        (complete cases; the dropped count is reported per site).
    outcome_kind: ``"binary"`` (0/1 outcome), ``"count"`` (a number ``>= 0``,
        e.g. cases, for a Poisson model), ``"continuous"`` (any finite number,
        for a Gaussian model) or ``"survival"`` (``Surv(time, event)``:
        follow-up time and 0/1 event indicator; or ``Surv(start, stop, event)``:
        one interval of follow-up per row).
    strata: columns whose combined values stratify a survival model within
        each site (a site is always its own stratum or strata).
    weights: name of a column of frequency weights (:mod:`fedstats.site.weights`),
        or ``None``.
    exposure: name of a column of positive exposures (person-time) whose log
        joins the offset (a Poisson rate model), or ``None``.
    """

    formula: str
    outcome: str
    variables: tuple[str, ...]
    levels: Mapping[str, tuple[Level, ...]]
    columns: tuple[str, ...]
    site_intercepts: bool
    sites: tuple[str, ...]
    offset: str | None = None
    missing: str = "raise"
    outcome_kind: str = "binary"
    strata: tuple[str, ...] = ()
    weights: str | None = None
    exposure: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "formula": self.formula,
            "outcome": self.outcome,
            "variables": list(self.variables),
            "levels": {k: list(v) for k, v in self.levels.items()},
            "columns": list(self.columns),
            "site_intercepts": self.site_intercepts,
            "sites": list(self.sites),
            "offset": self.offset,
            "missing": self.missing,
            "outcome_kind": self.outcome_kind,
            "strata": list(self.strata),
            "weights": self.weights,
            "exposure": self.exposure,
        }

    @classmethod
    def from_wire(cls, wire: Any) -> DesignSpec:
        """Rebuild a spec from a request; raises ``ValueError`` describing what is malformed."""
        if not isinstance(wire, dict):
            raise ValueError("the design must be a mapping")
        if set(wire) != set(WIRE_FIELDS):
            raise ValueError(f"the design must hold exactly {sorted(WIRE_FIELDS)}")
        if not all(isinstance(wire[k], str) for k in ("formula", "outcome")):
            raise ValueError("formula and outcome must be strings")
        for key in ("variables", "columns", "sites", "strata"):
            if not (isinstance(wire[key], list) and all(isinstance(v, str) for v in wire[key])):
                raise ValueError(f"{key} must be a list of strings")
        levels = wire["levels"]
        if not isinstance(levels, dict) or not all(
            isinstance(v, list) and all(isinstance(x, int | float | str) for x in v)
            for v in levels.values()
        ):
            raise ValueError("levels must map variables to lists of numbers or strings")
        for variable, values in levels.items():
            if any(isinstance(x, float) and not math.isfinite(x) for x in values):
                raise ValueError(f"the levels of {variable!r} must be finite numbers or strings")
            if len(set(values)) != len(values):  # 1, 1.0 and True are one level, as in pandas
                raise ValueError(f"the levels of {variable!r} must be distinct")
        if not isinstance(wire["site_intercepts"], bool):
            raise ValueError("site_intercepts must be a boolean")
        if wire["offset"] is not None and not isinstance(wire["offset"], str):
            raise ValueError("offset must be a column name or null")
        for key in ("weights", "exposure"):
            if wire[key] is not None and not isinstance(wire[key], str):
                raise ValueError(f"{key} must be a column name or null")
        if wire["missing"] not in ("raise", "drop"):
            raise ValueError("missing must be 'raise' or 'drop'")
        if wire["outcome_kind"] not in OUTCOME_KINDS:
            raise ValueError(f"outcome_kind must be one of {OUTCOME_KINDS}")
        if (wire["outcome_kind"] == "survival") != is_survival(wire["outcome"]):
            raise ValueError(
                "a survival design's outcome is Surv(time, event) or Surv(start, stop, event), "
                "and only its"
            )
        if wire["strata"] and wire["outcome_kind"] != "survival":
            raise ValueError("only survival designs have strata")
        if not wire["columns"]:
            raise ValueError("the design has no columns")
        return cls(
            formula=wire["formula"],
            outcome=wire["outcome"],
            variables=tuple(wire["variables"]),
            levels={k: tuple(v) for k, v in levels.items()},
            columns=tuple(wire["columns"]),
            site_intercepts=wire["site_intercepts"],
            sites=tuple(wire["sites"]),
            offset=wire["offset"],
            missing=wire["missing"],
            outcome_kind=wire["outcome_kind"],
            strata=tuple(wire["strata"]),
            weights=wire["weights"],
            exposure=wire["exposure"],
        )

    @property
    def key(self) -> str:
        """A digest identifying the spec (sites cache the built design under it)."""
        canonical = json.dumps(self.to_wire(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def n_params(self) -> int:
        return len(self.columns)


@dataclass(frozen=True)
class ParsedFormula:
    """A formula read by the grammar (:mod:`fedstats.contract.formula_grammar`), never evaluated.

    ``terms`` are the right-hand side's terms other than the intercept, each a
    tuple of factors, in the order written; ``intercept`` whether the
    right-hand side keeps one; ``outcome_factor`` the left-hand side's factor
    (``None`` for ``Surv(time, event)``, which is read by name).
    """

    text: str
    outcome: str
    outcome_variables: frozenset[str]
    covariates: frozenset[str]
    wrapped: frozenset[str]
    """Covariates written inside ``C()``: categorical whatever their type."""
    terms: tuple[tuple[Factor, ...], ...]
    intercept: bool
    outcome_factor: Factor | None

    @property
    def factors(self) -> tuple[Factor, ...]:
        """The distinct right-hand-side factors, in order of appearance."""
        seen: dict[str, Factor] = {}
        for term in self.terms:
            for factor in term:
                seen.setdefault(factor.name, factor)
        return tuple(seen.values())


def parse_formula(formula: str) -> ParsedFormula:
    """Read ``formula`` with the project's grammar and list the variables it reads.

    formulaic's parser splits the Wilkinson structure (it tokenises, it does
    not evaluate); :func:`fedstats.contract.formula_grammar.parse_factor` checks every
    factor. Raises :class:`~fedstats.errors.FormulaError` (for a term the
    grammar refuses, :class:`~fedstats.contract.formula_grammar.UnsafeTermError`
    naming it).
    """
    if not isinstance(formula, str) or "~" not in formula:
        raise FormulaError(f"a model formula needs an outcome and '~', got {formula!r}")
    if len(formula) > MAX_FORMULA_CHARS:
        raise FormulaError(f"a model formula may have at most {MAX_FORMULA_CHARS} characters")
    return _parsed(formula)


@functools.lru_cache(maxsize=256)
def _parsed(formula: str) -> ParsedFormula:
    """:func:`parse_formula` of a string within the length limit: a pure function of the
    text, read once per formula (every round of a fit names the same one); refusals are
    raised again each time."""
    try:
        parsed = Formula(formula)
        lhs_terms, rhs_terms = list(parsed.lhs), list(parsed.rhs)
        if not all(isinstance(t, Term) for t in lhs_terms + rhs_terms):
            raise FormulaError(
                f"a model formula has one outcome and one right-hand side: {formula!r}"
            )
    except (UnsafeTermError, FormulaError):
        raise
    except (FormulaicError, SyntaxError, ValueError, TypeError, RecursionError) as exc:
        raise FormulaError(f"cannot parse formula {formula!r}: {plain_message(str(exc))}") from None
    except AttributeError:  # formulaic read no two-sided formula (e.g. a lone '~')
        raise FormulaError(f"a model formula needs an outcome and '~', got {formula!r}") from None
    if len(lhs_terms) != 1 or len(lhs_terms[0].factors) != 1:
        raise FormulaError(f"the formula's left-hand side must be one outcome, got {parsed.lhs}")
    outcome = str(lhs_terms[0])
    survival = survival_outcome(outcome) or counting_outcome(outcome)
    outcome_factor: Factor | None = None
    if survival is not None:  # Surv() is read by name, not evaluated
        if len(set(survival)) != len(survival):
            raise FormulaError(f"{outcome} names one column twice; each part is its own column")
        outcome_vars = set(survival)
    else:
        lhs = lhs_terms[0].factors[0]
        outcome_factor = parse_factor(lhs.expr, lhs.eval_method.value)
        if outcome_factor.kind == "categorical":
            raise UnsafeTermError(outcome, "is not an outcome: write the 0/1 column, or I(...)")
        outcome_vars = set(outcome_factor.variables)
    terms: list[tuple[Factor, ...]] = []
    intercept = False
    for term in rhs_terms:
        factors = list(term.factors)
        if len(factors) == 1 and factors[0].eval_method.value == "literal":
            if factors[0].expr != "1":
                raise UnsafeTermError(factors[0].expr, "is a number where a term belongs")
            intercept = True
            continue
        terms.append(tuple(parse_factor(f.expr, f.eval_method.value) for f in factors))
    if len(terms) > MAX_TERMS:
        raise FormulaError(f"a model formula may have at most {MAX_TERMS} terms")
    factors = [f for term in terms for f in term]
    return ParsedFormula(
        text=formula,
        outcome=outcome,
        outcome_variables=frozenset(outcome_vars),
        covariates=frozenset(v for f in factors for v in f.variables),
        wrapped=frozenset(f.column for f in factors if f.kind == "categorical"),
        terms=tuple(terms),
        intercept=intercept,
        outcome_factor=outcome_factor,
    )


MAX_FORMULA_CHARS = 20_000
MAX_TERMS = 500


def normalise_level(level: Level) -> Level:
    """An integral float level becomes an int, so 1 and 1.0 agree across sites."""
    if isinstance(level, float) and math.isfinite(level) and level.is_integer():
        return int(level)
    return level


def union_levels(per_site: Mapping[str, Sequence[Level]], variable: str) -> tuple[Level, ...]:
    """Sorted union of the levels the sites reported; numbers and strings may not mix."""
    levels = {normalise_level(v) for values in per_site.values() for v in values}
    kinds = {isinstance(v, str) for v in levels}
    if len(kinds) > 1:
        site = next(s for s, vals in per_site.items() if any(isinstance(v, str) for v in vals))
        raise InconsistentColumnError(
            site=site,
            column=variable,
            reason="holds text levels where other sites hold numeric ones; recode it",
        )
    return tuple(sorted(levels))


@dataclass(frozen=True)
class DesignLayout:
    """How design columns group into formula terms (known before any data is read).

    ``categorical`` holds the columns whose term involves only categorical
    factors (0/1 dummies); ``n_terms`` counts the terms, intercept included.
    """

    columns: tuple[str, ...]
    n_terms: int
    categorical: frozenset[str]


def design_columns(
    parsed: ParsedFormula,
    variables: Sequence[str],
    levels: Mapping[str, Sequence[Level]],
) -> DesignLayout:
    """Design columns of the formula's right-hand side, found on a data-free skeleton.

    Nothing is evaluated: every categorical factor takes each agreed level
    once (and the skeleton has one row per level of the most-levelled one),
    every numeric factor the value 1. ``variables`` are the columns the
    formula reads (kept for the callers' records).
    """
    del variables
    n_rows = max([len(v) for v in levels.values()] + [1])
    values: dict[str, Any] = {}
    for factor in parsed.factors:
        if categorical_factor(factor, levels):
            agreed = list(levels[factor.column]) if factor.column in levels else None
            if agreed is None:
                raise FormulaError(f"{factor.name} needs agreed levels for {factor.column!r}")
            values[factor.name] = pd.Categorical(
                [agreed[i % len(agreed)] for i in range(n_rows)], categories=agreed
            )
        else:
            values[factor.name] = np.ones(n_rows)
    matrix, structure = model_frame(parsed, values, n_rows)
    categorical: set[str] = set()
    for term_factors, columns in structure:
        if term_factors and all(categorical_factor(f, levels) for f in term_factors):
            categorical |= set(columns)
    return DesignLayout(tuple(matrix.columns), len(structure), frozenset(categorical))


def categorical_factor(factor: Factor, levels: Mapping[str, Sequence[Level]]) -> bool:
    """Whether a factor enters the design as dummies: ``C(x)``, or a column with agreed levels."""
    return factor.kind == "categorical" or (factor.kind == "column" and factor.column in levels)


def model_frame(
    parsed: ParsedFormula, values: Mapping[str, Any], n_rows: int
) -> tuple[pd.DataFrame, list[tuple[tuple[Factor, ...], list[str]]]]:
    """The design matrix of ``parsed``'s right-hand side from each factor's values.

    formulaic builds it (treatment coding, full rank, its column order and
    names), but only from a formula the project writes itself, whose factors
    are synthetic names of the frame's columns: no text of the request is
    evaluated. Returns the matrix, with the factors' own names in its column
    names, and per term its factors and columns (the intercept's factors are
    empty).
    """
    tokens = {factor.name: f"zq{i}zq" for i, factor in enumerate(parsed.factors)}
    frame = pd.DataFrame(
        {tokens[name]: value for name, value in values.items()}, index=range(n_rows)
    )
    terms = [":".join(tokens[f.name] for f in term) for term in parsed.terms]
    text = " + ".join((["1"] if parsed.intercept else ["0"]) + terms)
    try:
        matrix = model_matrix(text, frame, ensure_full_rank=True, na_action="raise")
    except Exception as exc:  # noqa: BLE001 - formulaic raises many types
        raise FormulaError(
            f"cannot build the design of {parsed.text!r}: {plain_message(str(exc))}"
        ) from None
    back = {token: name for name, token in tokens.items()}
    pattern = re.compile(r"zq[0-9]+zq")
    rename = lambda column: pattern.sub(lambda m: back[m.group(0)], column)  # noqa: E731
    by_token = {tokens[f.name]: f for f in parsed.factors}
    structure = []
    for part in matrix.model_spec.structure:
        factors = tuple(by_token[str(f.expr)] for f in part.term.factors if str(f.expr) in by_token)
        structure.append((factors, [rename(c) for c in part.columns]))
    matrix.columns = [rename(c) for c in matrix.columns]
    return matrix, structure


def feature_scaling(
    layout: DesignLayout,
    columns: tuple[str, ...],
    bounds: Mapping[str, tuple[float, float]],
    sites: tuple[str, ...],
    *,
    shift_absorbed: bool = False,
) -> np.ndarray:
    """Per-column ``(centre, half-width)`` mapping public bounds to ``[-1, 1]``.

    Intercepts and dummies of categorical terms keep ``(0, 1)``. Without an
    intercept column numeric columns are only scaled (centre 0), since a
    shift could not be absorbed, unless ``shift_absorbed`` (a Cox model's
    baseline hazard absorbs it).
    """
    intercepts = {"Intercept"} | {SITE_COLUMN.format(s) for s in sites}
    has_intercept = shift_absorbed or bool(intercepts & set(columns))
    unknown = sorted(set(bounds) - set(columns))
    if unknown:
        raise FormulaError(
            f"bounds were given for {unknown}, which are not design columns "
            f"(the design has {list(columns)})"
        )
    missing = [
        c
        for c in columns
        if c not in intercepts and c not in layout.categorical and c not in bounds
    ]
    if missing:
        raise FormulaError(
            f"a private fit needs public bounds for the numeric design columns {missing}: "
            "pass bounds={'column': (low, high), ...} from the study specification"
        )
    scaling = np.tile([0.0, 1.0], (len(columns), 1))
    for j, name in enumerate(columns):
        if name in bounds:
            low, high = (float(v) for v in bounds[name])
            if not (math.isfinite(low) and math.isfinite(high) and high > low):
                raise FormulaError(f"bounds for {name!r} must be finite with low < high")
            if has_intercept:
                scaling[j] = ((low + high) / 2, (high - low) / 2)
            else:
                scaling[j] = (0.0, max(abs(low), abs(high)))
    return scaling


def unscale(columns: tuple[str, ...], scaling: np.ndarray, sites: tuple[str, ...]) -> np.ndarray:
    """Matrix ``A`` with ``beta = A beta'`` from scaled to original design coordinates.

    ``x'_j = (x_j - c_j) / h_j`` gives ``beta_j = beta'_j / h_j`` and each
    intercept absorbs ``- sum_j beta'_j c_j / h_j``.
    """
    intercepts = {"Intercept"} | {SITE_COLUMN.format(s) for s in sites}
    A = np.diag(1.0 / scaling[:, 1])
    for k, name in enumerate(columns):
        if name in intercepts:  # intercepts have centre 0, so their own entries stay 0 here
            A[k, :] = -scaling[:, 0] / scaling[:, 1]
            A[k, k] = 1.0
    return A
