"""A vertical fit's rows at one site: the covariates of the linked patients at a hospital,
their outcome at the registry, both in pair-id order (:mod:`fedstats.site.linked_rows`).

Built from the agreed design as every site builds one (the site's own parse of the formula,
the agreed levels, :func:`fedstats.contract.design_matrix.right_hand_side`), with the exact
release rules every site applies before its first answer about a design: at a hospital, the
small-cell rules on every design column and indicator and the saturation rule; at the
registry, both outcome values on at least ``k_cell`` linked patients; at both, the
differencing guard on the linked rows, each indicator's and each 0/1 column's rows (over the
site's whole frame, beside every row set it answered about before) and the columns of three
or more values (:mod:`fedstats.site.differencing`). Missing values are refused: the two
sites must fit the same linked patients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedstats.contract.design import DesignSpec
from fedstats.contract.design_matrix import design_columns, right_hand_side
from fedstats.errors import (
    FormulaError,
    InconsistentColumnError,
    MalformedRequestError,
    MissingColumnError,
    MissingValuesError,
)
from fedstats.site.cell_rules import check_columns, check_groups, check_indicator
from fedstats.site.design_cache import design_digest
from fedstats.site.design_outcomes import binary_outcome, evaluated_factor
from fedstats.site.disclosure import check_saturation
from fedstats.site.formula_check import checked_formula
from fedstats.site.handlers.design import (
    as_agreed_categorical,
    distinct_values_exceed,
    frame_columns,
    read_only,
)
from fedstats.site.task import SiteContext


@dataclass(frozen=True)
class LinkedDesign:
    """A hospital's design columns over its linked patients, in pair-id order."""

    columns: tuple[np.ndarray, ...]
    positions: np.ndarray

    @property
    def n_pairs(self) -> int:
        return len(self.positions)


def hospital_design(ctx: SiteContext, spec: DesignSpec, linkage: str, task: str) -> LinkedDesign:
    """The design's columns over the linkage's patients, checked and kept once per design."""
    key = ("vertical design", linkage, design_digest(spec))
    held = ctx.cache.get(key)
    if held is not None:
        return held
    _, positions = ctx.linkages.rows(linkage, task)
    parsed = checked_formula(spec)
    raw = _linked_values(ctx, sorted(parsed.covariates), positions)
    data = raw.copy()
    for var, levels in spec.levels.items():
        data[var] = as_agreed_categorical(ctx.name, var, data[var], levels)
    indicators: list[tuple[str, np.ndarray]] = []
    collect = lambda term, mask: indicators.append((term, np.asarray(mask, bool)))  # noqa: E731
    values = {}
    for factor in parsed.factors:
        if factor.kind == "expression":
            values[factor.name] = evaluated_factor(ctx.name, factor, raw, collect)
        elif factor.kind == "categorical" and factor.column not in spec.levels:
            raise MalformedRequestError(
                site=None, task=None, reason=f"{factor.name} needs agreed levels in the design"
            )
        else:
            column = data[factor.column]
            categorical = isinstance(column.dtype, pd.CategoricalDtype)
            values[factor.name] = column.array if categorical else column.to_numpy()
    n = len(positions)
    try:
        rhs = right_hand_side(parsed, values, n)
    except FormulaError:
        raise InconsistentColumnError(
            site=ctx.name, column=spec.formula, reason="cannot be built from this site's columns"
        ) from None
    if list(rhs.columns) != list(spec.columns):
        raise InconsistentColumnError(
            site=ctx.name,
            column=spec.formula,
            reason=f"yields design columns {list(rhs.columns)}, not the agreed "
            f"{list(spec.columns)}",
        )
    columns = [read_only(np.array(c, dtype=np.float64)) for c in design_columns(spec, rhs, n, None)]
    bad = [j for j, column in enumerate(columns) if not np.isfinite(column).all()]
    if bad:
        raise InconsistentColumnError(
            site=ctx.name, column=spec.columns[bad[0]], reason="has non-finite values"
        )
    varying = [j for j, name in enumerate(spec.columns) if name != "Intercept"]
    policy = ctx.policy
    check_saturation(
        policy,
        site=ctx.name,
        task=task,
        n_parameters=sum(bool(columns[j].any()) for j in varying),
        n_patients=n,
    )
    for term, mask in indicators:
        check_indicator(policy, site=ctx.name, task=task, term=term, mask=mask)
    names = [spec.columns[j] for j in varying]
    check_columns(policy, site=ctx.name, task=task, names=names, X=[columns[j] for j in varying])
    sets = [(term, mask) for term, mask in indicators]
    answered = []
    for j in varying:
        if distinct_values_exceed(columns[j], 2):
            answered.append((spec.columns[j], columns[j]))
        elif distinct_values_exceed(columns[j], 1):
            sets.append((spec.columns[j], columns[j] != columns[j][0]))
    _guard(ctx, task, linkage, positions, sets, answered)
    design = LinkedDesign(tuple(columns), positions)
    ctx.cache[key] = design
    return design


def registry_outcome(ctx: SiteContext, spec: DesignSpec, linkage: str, task: str) -> np.ndarray:
    """The 0/1 outcome of the linkage's patients in pair-id order, with both values on at
    least ``k_cell`` of them; kept once per design."""
    key = ("vertical outcome", linkage, design_digest(spec))
    held = ctx.cache.get(key)
    if held is not None:
        return held
    _, positions = ctx.linkages.rows(linkage, task)
    parsed = checked_formula(spec)
    raw = _linked_values(ctx, sorted(parsed.outcome_variables), positions)
    indicators: list[tuple[str, np.ndarray]] = []
    collect = lambda term, mask: indicators.append((term, np.asarray(mask, bool)))  # noqa: E731
    y = np.asarray(binary_outcome(ctx.name, spec.outcome, parsed, raw, collect), dtype=np.int64)
    check_groups(
        ctx.policy, site=ctx.name, task=task, what=f"the outcome {spec.outcome!r}", codes=y
    )
    for term, mask in indicators:
        check_indicator(ctx.policy, site=ctx.name, task=task, term=term, mask=mask)
    _guard(ctx, task, linkage, positions, indicators, [])
    y.flags.writeable = False
    ctx.cache[key] = y
    return y


def _linked_values(ctx: SiteContext, variables: list[str], positions: np.ndarray) -> pd.DataFrame:
    """The frame's ``variables`` on the linked rows, in pair-id order; no missing value."""
    for var in variables:
        if var not in ctx.frame.columns:
            raise MissingColumnError(site=ctx.name, column=var)
    raw = frame_columns(ctx.frame, variables).iloc[positions].reset_index(drop=True)
    counts = raw.isna().sum()
    if counts.any():
        var = str(counts[counts > 0].index[0])
        raise MissingValuesError(site=ctx.name, column=var, count=int(counts[var]))
    return raw


def _guard(
    ctx: SiteContext,
    task: str,
    linkage: str,
    positions: np.ndarray,
    sets: list[tuple[str, np.ndarray]],
    columns: list[tuple[str, np.ndarray]],
) -> None:
    """The differencing guard on the linked rows and on ``sets`` (masks over them), each as a
    row set over the site's frame, and on ``columns`` (over the linked rows in pair order)."""
    n = len(ctx.frame)

    def over_frame(mask: np.ndarray) -> np.ndarray:
        full = np.zeros(n, dtype=bool)
        full[positions[np.asarray(mask, bool)]] = True
        return full

    frame_sets = [(f"the rows of linkage {linkage!r}", over_frame(np.ones(len(positions), bool)))]
    frame_sets += [(label, over_frame(mask)) for label, mask in sets]
    ctx.guard.check_release(ctx.name, task, frame_sets, columns, rows=positions)
