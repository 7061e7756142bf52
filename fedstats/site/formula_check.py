"""The site's own reading of a design's formula: a spec that contradicts it is refused.

The coordinator sends a :class:`~fedstats.contract.design.DesignSpec`; before
building any column from its rows, a site parses the spec's formula with the
contract's grammar (:func:`~fedstats.contract.design.parse_formula`) and
refuses a spec whose variables, outcome, levels, strata or column roles do not
match it.
"""

from __future__ import annotations

from fedstats.contract.design import DesignSpec, ParsedFormula, parse_formula
from fedstats.errors import (
    FormulaError,
    FormulaRefusedError,
    MalformedRequestError,
    UnsafeTermError,
)


def checked_formula(spec: DesignSpec) -> ParsedFormula:
    """The site parses the formula itself and refuses a spec inconsistent with it."""
    try:
        parsed = parse_formula(spec.formula)
    except UnsafeTermError as error:
        raise FormulaRefusedError(
            site=None, task=None, term=error.token, reason=error.reason
        ) from None
    except FormulaError as error:
        raise MalformedRequestError(site=None, task=None, reason=str(error)) from None
    variables = parsed.outcome_variables | parsed.covariates
    if set(spec.variables) != variables or parsed.outcome != spec.outcome:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason="the design's variables or outcome do not match its formula",
        )
    unknown = sorted(set(spec.levels) - parsed.covariates)
    if set(spec.strata) & variables:
        raise MalformedRequestError(
            site=None, task=None, reason="the design's strata also appear in its formula"
        )
    for role in (spec.weights, spec.exposure):
        others = [spec.offset, spec.weights, spec.exposure]
        if role is not None and (
            role in variables or others.count(role) > 1 or role in spec.strata
        ):
            raise MalformedRequestError(
                site=None, task=None, reason=f"the design's column {role!r} has two roles"
            )
    if unknown or (spec.offset is not None and spec.offset in variables):
        raise MalformedRequestError(
            site=None, task=None, reason="the design's levels or offset do not match its formula"
        )
    return parsed
