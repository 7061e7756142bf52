"""An agreed design built from a frame the analyst holds: the same columns every site built.

A fit's results carry the design the sites agreed on (:class:`DesignSpec`: formula,
levels, columns). :func:`design_matrix` builds that design from a ``pandas``
DataFrame — new patients to predict for — with the same parser, expression
evaluator and model frame the sites use (:func:`fedstats.contract.design.model_frame`,
:func:`fedstats.contract.formula_grammar.evaluate`), so a coefficient multiplies
the same column on both sides. Categorical levels are the agreed ones (a level the
fit never saw is refused, naming the column and the value); rows with a missing
value are kept, and their predictions are missing (NaN): never dropped silently, so a
prediction stays aligned with its row.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fedstats.contract.design import (
    SITE_COLUMN,
    DesignSpec,
    Level,
    ParsedFormula,
    model_frame,
    normalise_level,
    parse_formula,
)
from fedstats.contract.formula_grammar import DomainError, UnsafeTermError, evaluate
from fedstats.errors import FormulaError


class PredictionInputError(FormulaError):
    """A frame given to ``predict`` cannot be built into the fit's design."""


def plain(value: Any) -> Any:
    """numpy scalars to Python numbers; everything else unchanged."""
    if isinstance(value, np.generic):
        return value.item()
    return value


def agreed_codes(column: pd.Series, levels: Sequence[Level]) -> tuple[pd.Categorical, pd.Series]:
    """``column`` as a categorical of the agreed ``levels`` and the values outside them (with
    their counts, most frequent first; missing values are neither)."""
    allowed = {normalise_level(v) for v in levels}
    values = column.astype(object).map(lambda v: v if pd.isna(v) else normalise_level(plain(v)))
    unknown = values[values.notna() & ~values.isin(allowed)]
    return pd.Categorical(values, categories=list(levels)), unknown.value_counts()


def site_columns(spec: DesignSpec) -> set[str]:
    """The per-site intercept columns of a design fitted with ``site_intercepts``."""
    return {SITE_COLUMN.format(s) for s in spec.sites} if spec.site_intercepts else set()


LAYOUT_ROWS = 4
"""Rows of stand-in numbers from which formulaic lays out a design of numeric columns only
(:func:`numeric_layout`)."""


class NumericColumns:
    """A right-hand side whose every term is one numeric factor: each design column is that
    factor's values (:func:`right_hand_side`); read like formulaic's model matrix
    (``columns``, and a column by name)."""

    def __init__(self, columns: list[str], values: dict[str, np.ndarray], n_rows: int) -> None:
        self.columns = columns
        self._values = values
        self._n_rows = n_rows

    def __getitem__(self, name: str) -> np.ndarray:
        return np.ones(self._n_rows) if name == "Intercept" else self._values[name]


def right_hand_side(
    parsed: ParsedFormula, values: dict[str, Any], n_rows: int
) -> pd.DataFrame | NumericColumns:
    """The design columns of ``parsed``'s right-hand side for ``n_rows`` rows, by name.

    formulaic builds the model matrix (:func:`fedstats.contract.design.model_frame`). When
    every term is one factor with numeric values (a numeric column, ``I(...)``, a
    function), formulaic's column for the term is those values as they are: formulaic then
    lays the design out (names, order, intercept) from numbers standing in for the values
    (:func:`numeric_layout`, once per formula), and the columns are the values themselves,
    not copied into a frame and out of formulaic's. Raises
    :class:`~fedstats.errors.FormulaError` as ``model_frame`` does.
    """
    numeric = n_rows > 0 and all(
        len(term) == 1 and _numeric(values.get(term[0].name)) for term in parsed.terms
    )
    columns = numeric_layout(parsed.text) if numeric else None
    if columns is None:
        return model_frame(parsed, values, n_rows)[0]
    return NumericColumns(
        list(columns), {c: values[c] for c in columns if c != "Intercept"}, n_rows
    )


@functools.lru_cache(maxsize=256)
def numeric_layout(formula: str) -> tuple[str, ...] | None:
    """formulaic's design columns for ``formula`` when each factor of its right-hand side is
    a numeric column (stand-in values), or ``None`` unless each column is one factor's
    values under that factor's name (or the intercept)."""
    parsed = parse_formula(formula)
    if any(f.name == "Intercept" for f in parsed.factors):
        return None
    stand_in = {f.name: np.arange(1.0, LAYOUT_ROWS + 1) for f in parsed.factors}
    try:
        layout, structure = model_frame(parsed, stand_in, LAYOUT_ROWS)
    except FormulaError:
        return None  # left to the model frame of the values themselves
    for factors, columns in structure:
        if len(factors) > 1 or columns != (["Intercept"] if not factors else [factors[0].name]):
            return None
    columns = tuple(str(c) for c in layout.columns)
    return columns if len(set(columns)) == len(columns) else None


def _numeric(value: Any) -> bool:
    """Whether formulaic reads ``value`` as one numeric column (not booleans, not levels)
    with no missing value (which formulaic refuses: left to it, to refuse as it does)."""
    if not (isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iuf"):
        return False
    return value.dtype.kind != "f" or not np.isnan(value).any()


def design_columns(
    spec: DesignSpec, rhs: pd.DataFrame | NumericColumns | None, n_rows: int, site: str | None
) -> list[np.ndarray]:
    """The agreed columns in order, each one contiguous float64 array: the model frame's (a
    numeric column's own values, not copied), and 1 in ``site``'s own intercept column (0 in
    the other sites'). Read-only: they may be the caller's arrays."""
    own = None if site is None else SITE_COLUMN.format(site)
    intercepts = site_columns(spec)
    columns = []
    for name in spec.columns:
        if name in intercepts:
            columns.append(np.full(n_rows, 1.0 if name == own else 0.0))
        elif rhs is not None:
            columns.append(np.ascontiguousarray(rhs[name], dtype=np.float64))
        else:
            columns.append(np.zeros(n_rows))
    return columns


STACK_BYTES = 1 << 20
"""Rows of :func:`stacked`'s result written at a time (1 MiB of them, held in cache)."""


def stacked(columns: list[np.ndarray], n_rows: int) -> np.ndarray:
    """The columns side by side in one row-major float64 array, written a block of rows at a
    time, so each block is filled where it lies in cache rather than one column at a time
    across the whole array."""
    X = np.empty((n_rows, len(columns)))
    size = max(256, STACK_BYTES // (8 * max(len(columns), 1)))
    for start in range(0, n_rows, size):
        rows = slice(start, start + size)
        for j, column in enumerate(columns):
            X[rows, j] = column[rows]
    return X


def assemble(
    spec: DesignSpec, rhs: pd.DataFrame | NumericColumns | None, n_rows: int, site: str | None
) -> np.ndarray:
    """The agreed columns in order (:func:`design_columns`), row-major."""
    return stacked(design_columns(spec, rhs, n_rows, site), n_rows)


def design_matrix(
    spec: DesignSpec, frame: pd.DataFrame, *, site: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(X, complete, offset)`` of ``frame`` under ``spec``: one row per row of ``frame``.

    ``complete`` marks the rows whose covariates are all present (the others' rows of
    ``X`` are NaN). ``offset`` is the design's offset column (plus the log of its exposure
    column) when it has one. ``site`` names the site whose intercept applies to a fit with
    per-site intercepts; without it such a fit cannot predict. Raises
    :class:`PredictionInputError` naming the column for a column the frame lacks, a level
    the sites never agreed on, or an expression that cannot be computed.
    """
    if not isinstance(frame, pd.DataFrame):
        raise PredictionInputError(
            f"predict takes a pandas DataFrame with the formula's columns, got "
            f"{type(frame).__name__}"
        )
    if spec.site_intercepts and site not in spec.sites:
        raise PredictionInputError(
            f"this fit has one intercept per site {list(spec.sites)}: pass site= to say whose "
            f"intercept applies (got {site!r})"
        )
    parsed = parse_formula(spec.formula)
    survival = spec.outcome_kind == "survival"
    needed = [v for v in spec.variables if v in parsed.covariates]
    needed += [c for c in (spec.offset, spec.exposure) if c and c not in needed]
    missing = [column for column in needed if column not in frame.columns]
    if missing:
        raise PredictionInputError(
            f"the frame has no column {missing[0]!r}, which the fit's design "
            f"({spec.formula!r}) needs; columns needed: {needed}"
        )
    data = frame[needed].reset_index(drop=True)
    complete = ~data.isna().any(axis=1).to_numpy()
    rows = data[complete]
    values: dict[str, Any] = {}
    for factor in parsed.factors:
        if factor.kind == "expression":
            try:
                values[factor.name] = evaluate(factor, {v: rows[v] for v in factor.variables})
            except (UnsafeTermError, DomainError) as error:
                raise PredictionInputError(
                    f"{factor.name} cannot be computed for every row of the frame: {error}"
                ) from None
        elif factor.column in spec.levels:
            codes, unknown = agreed_codes(rows[factor.column], spec.levels[factor.column])
            if len(unknown):
                raise PredictionInputError(
                    f"column {factor.column!r} has {int(unknown.iloc[0])} value(s) "
                    f"{plain(unknown.index[0])!r} outside the levels the fit agreed on "
                    f"{list(spec.levels[factor.column])}; recode them or leave the rows out"
                )
            values[factor.name] = codes
        else:
            values[factor.name] = pd.to_numeric(rows[factor.column], errors="coerce").to_numpy()
    n = int(complete.sum())
    rhs = model_frame(parsed, values, n)[0] if n else None
    if rhs is not None:
        wanted = [c for c in spec.columns if c not in site_columns(spec)]
        got = [
            c for c in rhs.columns if not ((survival or spec.site_intercepts) and c == "Intercept")
        ]
        if got != wanted:
            raise PredictionInputError(
                f"the frame yields design columns {got}, not the fit's {wanted}"
            )
    X = np.full((len(data), len(spec.columns)), np.nan)
    X[complete] = assemble(spec, rhs, n, site)
    offset = None
    if spec.offset or spec.exposure:
        offset = np.zeros(len(data))
        if spec.offset:
            offset += pd.to_numeric(data[spec.offset], errors="coerce").to_numpy(dtype=float)
        if spec.exposure:
            exposure = pd.to_numeric(data[spec.exposure], errors="coerce").to_numpy(dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                offset += np.where(exposure > 0, np.log(exposure), np.nan)
    return X, complete, offset
