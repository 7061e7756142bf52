"""The design a study agrees on before any fit: formula, levels and design columns.

A site must never decide its design columns by itself: if one site lacked a
level, its dummy coding would silently differ from the others'. So the
coordinator first asks every site for the kind of each variable and the
levels of each categorical one (refused for identifier-like columns, see
:func:`fedstats.disclosure.check_levels`), takes their union (or the levels
the analyst fixed), derives the design columns from the formula on a
synthetic skeleton frame that holds no patient data, and sends the resulting
:class:`DesignSpec` with every request. Each site builds exactly these
columns or refuses with a typed error.
"""

from __future__ import annotations

import ast
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

from fedstats.errors import FormulaError, InconsistentColumnError

Level = int | float | str

SITE_COLUMN = "site[{}]"
"""Name of a site's own intercept column when ``site_intercepts=True``."""


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
)
"""The fields of a design on the wire (:meth:`DesignSpec.to_wire`), in order."""

OUTCOME_KINDS = ("binary", "survival")
_SURV = re.compile(r"^\s*Surv\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def survival_outcome(outcome: str) -> tuple[str, str] | None:
    """``(time, event)`` of a ``Surv(time, event)`` outcome, else ``None``."""
    match = _SURV.match(outcome)
    return (match.group(1), match.group(2)) if match else None


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
    outcome_kind: ``"binary"`` (0/1 outcome) or ``"survival"``
        (``Surv(time, event)``: follow-up time and 0/1 event indicator).
    strata: columns whose combined values stratify a survival model within
        each site (a site is always its own stratum or strata).
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
        if not isinstance(wire["site_intercepts"], bool):
            raise ValueError("site_intercepts must be a boolean")
        if wire["offset"] is not None and not isinstance(wire["offset"], str):
            raise ValueError("offset must be a column name or null")
        if wire["missing"] not in ("raise", "drop"):
            raise ValueError("missing must be 'raise' or 'drop'")
        if wire["outcome_kind"] not in OUTCOME_KINDS:
            raise ValueError(f"outcome_kind must be one of {OUTCOME_KINDS}")
        survival = survival_outcome(wire["outcome"])
        if (wire["outcome_kind"] == "survival") != (survival is not None):
            raise ValueError("a survival design's outcome is Surv(time, event), and only its")
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
    """A formula with the variables each side reads."""

    formula: Formula
    outcome: str
    outcome_variables: frozenset[str]
    covariates: frozenset[str]
    wrapped: frozenset[str]
    """Covariates written inside ``C()``: categorical whatever their type."""


def parse_formula(formula: str) -> ParsedFormula:
    """Parse ``formula`` with formulaic and list the variables it reads."""
    if not isinstance(formula, str) or "~" not in formula:
        raise FormulaError(f"a model formula needs an outcome and '~', got {formula!r}")
    try:
        parsed = Formula(formula)
    except (FormulaicError, SyntaxError, ValueError) as exc:
        raise FormulaError(f"cannot parse formula {formula!r}: {exc}") from None
    lhs_terms = list(parsed.lhs)
    if len(lhs_terms) != 1:
        raise FormulaError(f"the formula's left-hand side must be one outcome, got {parsed.lhs}")
    outcome_vars = {v for f in lhs_terms[0].factors for v in _factor_variables(f)}
    survival = survival_outcome(str(lhs_terms[0]))
    if survival is not None:  # Surv() is read by name, not evaluated
        outcome_vars = set(survival)
    covariates: set[str] = set()
    wrapped: set[str] = set()
    for term in parsed.rhs:
        for factor in term.factors:
            covariates |= _factor_variables(factor)
            if factor.expr.replace(" ", "").startswith("C("):
                wrapped |= set(factor.required_variables)
    return ParsedFormula(
        parsed,
        str(lhs_terms[0]),
        frozenset(outcome_vars),
        frozenset(covariates),
        frozenset(wrapped),
    )


def _factor_variables(factor: Any) -> set[str]:
    """Data columns a factor reads: formulaic's list, plus names inside stateful transforms.

    formulaic does not list the arguments of stateful transforms such as
    ``center(age)``; those are found in the expression's syntax tree (names
    that are not called and are not modules).
    """
    names = set(factor.required_variables)
    if factor.eval_method.value == "python":
        try:
            tree = ast.parse(factor.expr, mode="eval")
        except SyntaxError:
            return names
        called = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        attribute_roots = {
            n.value.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        }
        names |= (
            {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - called - attribute_roots
        )
    return names


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
    formula: Formula,
    variables: Sequence[str],
    levels: Mapping[str, Sequence[Level]],
) -> DesignLayout:
    """Design columns of the formula's right-hand side, found on a data-free skeleton frame.

    The skeleton has one row per level of the most-levelled categorical
    variable, every level present, and 1.0 in numeric columns. Stateful
    transforms (``center``, ``scale``, splines, ...) are refused: each site
    would learn their state from its own rows, so sites would disagree.
    """
    n_rows = max([len(v) for v in levels.values()] + [1])
    skeleton = {}
    for var in variables:
        if var in levels:
            values = [levels[var][i % len(levels[var])] for i in range(n_rows)]
            skeleton[var] = pd.Categorical(values, categories=list(levels[var]))
        else:
            skeleton[var] = np.ones(n_rows)
    try:
        matrix = model_matrix(formula.rhs, pd.DataFrame(skeleton), ensure_full_rank=True)
    except Exception as exc:  # noqa: BLE001 - formulaic raises many types
        raise FormulaError(f"cannot build the design of {formula.rhs}: {exc}") from None
    state = matrix.model_spec.transform_state
    if state:
        raise FormulaError(
            f"stateful transform(s) {sorted(state)} would be fitted to each site's own rows; "
            "compute such covariates during harmonisation with study-wide constants instead"
        )
    categorical: set[str] = set()
    for structure in matrix.model_spec.structure:
        names = {str(v) for factor in structure.term.factors for v in _factor_variables(factor)}
        if names and names <= set(levels):
            categorical |= set(structure.columns)
    return DesignLayout(
        tuple(matrix.columns), len(matrix.model_spec.structure), frozenset(categorical)
    )
