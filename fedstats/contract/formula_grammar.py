"""The formula grammar: what a model formula may say, read without evaluating it.

A formula comes from the coordinator, so at a site it is hostile text. It is
never evaluated as Python. The Wilkinson structure (``+ - : * ( ) 0 1``) is
read by formulaic's parser, which only tokenises; every *factor* it finds is
then parsed by Python's :mod:`ast` and accepted only if it is built from

* column names (identifiers, or any text in backquotes);
* ``C(name)`` — a column taken as categorical (no options);
* ``I(expression)`` and the functions in :data:`FUNCTIONS` applied to an
  expression, where an expression holds column names, numbers,
  ``+ - * / **`` and unary minus, comparisons (``== != < <= > >=``; a quoted
  level only on the right of ``==`` or ``!=``), ``&``, ``|``, ``~`` and
  parentheses.

Everything else — attribute access (``age.__class__``, ``age.index``,
``np.log``), subscripts, dunder names, lambdas, comprehensions, f-strings,
keyword arguments, starred arguments, unknown calls — is refused with
:class:`UnsafeTermError` naming the token. The project's own evaluator
(:func:`evaluate`) computes an accepted factor on numpy arrays, refusing
values outside a function's domain instead of turning them into missing
rows, and hands every true/false value it computes to a callback (the site's
small-cell rule on sub-expressions, :func:`fedstats.site.cell_rules.check_indicator`).

This is DataSHIELD's rule (Gaye et al., Int J Epidemiol 2014): server-side
functions whose arguments are parsed, never evaluated.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedstats.errors import DomainError, FormulaError, UnsafeTermError

FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "log": np.log,
    "log1p": np.log1p,
    "log2": np.log2,
    "log10": np.log10,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "abs": np.abs,
}
"""The functions a formula may call, each of one numeric argument."""

STATEFUL = frozenset({"center", "scale", "standardize", "bs", "cr", "cs", "cc", "te", "poly"})
"""formulaic's stateful transforms, refused with their own explanation."""

MAX_FACTOR_CHARS = 1_000
MAX_NODES = 200
"""Most characters and syntax-tree nodes of one factor (a bound on the work it can ask for)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m|⧛|⧚")


def plain_message(text: str) -> str:
    """A parser message without terminal colour codes or formulaic's highlight marks."""
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class Factor:
    """One factor of a term.

    ``name`` is the factor as it appears in design column names (formulaic's
    spelling, e.g. ``age``, ``C(sex)``, ``I(age ** 2)``, ``log(chol)``);
    ``kind`` is ``"column"`` (a column, numeric or categorical as the study
    agreed), ``"categorical"`` (``C(column)``) or ``"expression"`` (``I(...)``
    or a function), ``variables`` the columns it reads.
    """

    name: str
    kind: str
    variables: frozenset[str]
    tree: ast.expr | None = None

    @property
    def column(self) -> str:
        """The column of a ``column`` or ``categorical`` factor."""
        return next(iter(self.variables))


def parse_factor(expr: str, method: str) -> Factor:
    """Check one factor formulaic found (its text and evaluation method) against the grammar."""
    if len(expr) > MAX_FACTOR_CHARS:
        raise UnsafeTermError(expr[:60] + "...", "is longer than a formula term may be")
    if method == "lookup":
        _check_name(expr)
        return Factor(expr, "column", frozenset([expr]))
    if method != "python":
        raise UnsafeTermError(expr, "is not a column, C(column), I(expression) or a function")
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        raise UnsafeTermError(expr, "is not a valid expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise UnsafeTermError(expr[:60], f"has more than {MAX_NODES} parts")
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Name):
        raise UnsafeTermError(expr, "must be written inside I() (or be a column or C(column))")
    function = tree.func.id
    if tree.keywords or len(tree.args) != 1 or isinstance(tree.args[0], ast.Starred):
        raise UnsafeTermError(expr, f"calls {function}() with other than one plain argument")
    argument = tree.args[0]
    if function == "C":
        if not isinstance(argument, ast.Name):
            raise UnsafeTermError(expr, "C() takes one column name and no options")
        _check_name(argument.id)
        return Factor(f"C({argument.id})", "categorical", frozenset([argument.id]))
    if function == "I":
        variables = check_expression(argument)
        return Factor(f"I({ast.unparse(argument)})", "expression", variables, argument)
    if function in FUNCTIONS:
        variables = check_expression(argument)
        return Factor(ast.unparse(tree), "expression", variables, tree)
    if function in STATEFUL:
        raise UnsafeTermError(
            function,
            "is a stateful transform, which each site would fit to its own rows; compute such "
            "covariates during harmonisation with study-wide constants",
        )
    raise UnsafeTermError(
        function,
        f"is not an allowed function (allowed: C, I, {', '.join(sorted(FUNCTIONS))}); compute "
        "other transforms during harmonisation with study-wide constants",
    )


def check_expression(node: ast.AST) -> frozenset[str]:
    """The columns an expression reads; raises :class:`UnsafeTermError` for anything not allowed."""
    names: set[str] = set()
    _check(node, names)
    return frozenset(names)


_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)
_LOGICAL = (ast.BitAnd, ast.BitOr)
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _check(node: ast.AST, names: set[str]) -> None:
    if isinstance(node, ast.Name):
        _check_name(node.id)
        names.add(node.id)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise UnsafeTermError(ast.unparse(node), "is not a number (a quoted level may only "
                                  "follow == or != after a column)")  # fmt: skip
    elif isinstance(node, ast.BinOp) and isinstance(node.op, _ARITHMETIC + _LOGICAL):
        _check(node.left, names)
        _check(node.right, names)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd | ast.Invert):
        _check(node.operand, names)
    elif isinstance(node, ast.Compare):
        if not all(isinstance(op, _COMPARISONS) for op in node.ops):
            raise UnsafeTermError(ast.unparse(node), "uses a comparison that is not allowed")
        _check(node.left, names)
        for op, right in zip(node.ops, node.comparators, strict=True):
            if _is_level(right):
                if not (isinstance(op, ast.Eq | ast.NotEq) and len(node.ops) == 1):
                    raise UnsafeTermError(ast.unparse(node), "compares a quoted level other "
                                          "than with == or !=")  # fmt: skip
                if not isinstance(node.left, ast.Name):
                    raise UnsafeTermError(ast.unparse(node), "compares a quoted level with "
                                          "something other than a column")  # fmt: skip
            else:
                _check(right, names)
    elif isinstance(node, ast.Call):
        function = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        if function not in FUNCTIONS:
            raise UnsafeTermError(function, f"is not an allowed function (allowed: "
                                  f"{', '.join(sorted(FUNCTIONS))})")  # fmt: skip
        if node.keywords or len(node.args) != 1 or isinstance(node.args[0], ast.Starred):
            raise UnsafeTermError(ast.unparse(node), "must call a function with one argument")
        _check(node.args[0], names)
    else:
        raise UnsafeTermError(ast.unparse(node), _refusal(node))


def _refusal(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return "reads an attribute, which a formula may not do"
    if isinstance(node, ast.Subscript):
        return "indexes a value, which a formula may not do"
    if isinstance(node, ast.Lambda):
        return "defines a function, which a formula may not do"
    if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
        return "is a comprehension, which a formula may not hold"
    return f"is a {type(node).__name__} expression, which a formula may not hold"


def _is_level(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _check_name(name: str) -> None:
    if not name or name.startswith("__") or len(name) > 200 or any(c in name for c in "`\n\r"):
        raise UnsafeTermError(name, "is not a column name a formula may use")


# ---------------------------------------------------------------- evaluation

Indicator = Callable[[str, np.ndarray], None]
"""Called with every true/false value an expression computes: (its text, the mask)."""


def evaluate(
    factor: Factor,
    columns: Mapping[str, pd.Series],
    on_indicator: Indicator | None = None,
    *,
    total: bool = False,
) -> np.ndarray:
    """The values of an ``expression`` factor over the rows of ``columns`` (float64).

    Columns enter as numbers; a true/false result becomes 0/1. Every
    comparison, ``&``, ``|`` and ``~`` result is passed to ``on_indicator``
    before it is used. A value outside a function's domain (the log of 0, a
    division by zero, an overflow) raises :class:`DomainError` rather than
    producing a missing value that would silently drop a row.

    With ``total`` (a differentially private release), nothing about the values
    raises: each row's value is computed as IEEE arithmetic gives it (``log(0)``
    is ``-inf``, ``sqrt(-1)`` NaN), and the caller leaves rows without a finite
    value out of the release, counting them. Whether a private request is
    answered then never depends on any patient's values
    (:mod:`fedstats.site.private_rows`).
    """
    if factor.tree is None:
        raise FormulaError(f"{factor.name!r} is not an expression")
    with np.errstate(all="ignore" if total else "raise"):
        try:
            value = _evaluate(factor.tree, columns, on_indicator, strict=not total)
        except (FloatingPointError, OverflowError, ZeroDivisionError):
            raise DomainError(factor.name) from None
    result = np.asarray(value, dtype=np.float64)
    if result.ndim == 0:
        n = len(next(iter(columns.values()))) if columns else 0
        result = np.full(n, float(result))
    if not total and not np.isfinite(result).all():
        raise DomainError(factor.name)
    return result


def _evaluate(
    node: ast.AST,
    columns: Mapping[str, pd.Series],
    on_indicator: Indicator | None,
    *,
    strict: bool = True,
):
    if isinstance(node, ast.Name):
        return _numeric(node.id, columns)
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, columns, on_indicator, strict=strict)
        right = _evaluate(node.right, columns, on_indicator, strict=strict)
        if isinstance(node.op, _LOGICAL):
            result = _logical(node, left, right)
            _report(node, result, on_indicator)
            return result
        left, right = _as_number(left), _as_number(right)
        if strict and isinstance(node.op, ast.Div) and np.any(np.asarray(right) == 0):
            raise ZeroDivisionError
        operations = {
            ast.Add: np.add,
            ast.Sub: np.subtract,
            ast.Mult: np.multiply,
            ast.Div: np.divide,
            ast.Pow: np.power,
        }
        return operations[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, columns, on_indicator, strict=strict)
        if isinstance(node.op, ast.Invert):
            if np.asarray(operand).dtype != bool:
                raise UnsafeTermError(
                    ast.unparse(node), "negates with ~ a value that is not true/false"
                )
            result = ~np.asarray(operand)
            _report(node, result, on_indicator)
            return result
        number = _as_number(operand)
        return -number if isinstance(node.op, ast.USub) else number
    if isinstance(node, ast.Compare):
        result = None
        left_node, left = node.left, None
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            if _is_level(right_node):
                values = _levels(left_node.id, columns)  # type: ignore[attr-defined]
                part = (
                    (values == right_node.value)
                    if isinstance(op, ast.Eq)
                    else (values != right_node.value)
                )
            else:
                left = (
                    _as_number(_evaluate(left_node, columns, on_indicator, strict=strict))
                    if left is None
                    else left
                )
                right = _as_number(_evaluate(right_node, columns, on_indicator, strict=strict))
                part = _COMPARE[type(op)](left, right)
                left = right
            part = np.asarray(part, dtype=bool)
            result = part if result is None else result & part
            left_node = right_node
        _report(node, result, on_indicator)
        return result
    if isinstance(node, ast.Call):
        argument = _as_number(_evaluate(node.args[0], columns, on_indicator, strict=strict))
        function = FUNCTIONS[node.func.id]  # type: ignore[attr-defined]
        if not strict:
            return function(argument)
        if function in (np.log, np.log2, np.log10) and np.any(np.asarray(argument) <= 0):
            raise FloatingPointError
        if function is np.log1p and np.any(np.asarray(argument) <= -1):
            raise FloatingPointError
        if function is np.sqrt and np.any(np.asarray(argument) < 0):
            raise FloatingPointError
        return function(argument)
    raise UnsafeTermError(ast.unparse(node), _refusal(node))  # the checker refused it already


_COMPARE = {
    ast.Eq: np.equal,
    ast.NotEq: np.not_equal,
    ast.Lt: np.less,
    ast.LtE: np.less_equal,
    ast.Gt: np.greater,
    ast.GtE: np.greater_equal,
}


def _report(node: ast.AST, mask: np.ndarray, on_indicator: Indicator | None) -> None:
    if on_indicator is not None and np.ndim(mask) == 1:
        on_indicator(ast.unparse(node), mask)


def _logical(node: ast.BinOp, left, right) -> np.ndarray:
    if np.asarray(left).dtype != bool or np.asarray(right).dtype != bool:
        raise UnsafeTermError(ast.unparse(node), "combines with & or | values that are not "
                              "true/false (write the comparisons in parentheses)")  # fmt: skip
    return (left & right) if isinstance(node.op, ast.BitAnd) else (left | right)


def _as_number(value):
    array = np.asarray(value)
    return array.astype(np.float64) if array.dtype == bool else value


def _numeric(name: str, columns: Mapping[str, pd.Series]) -> np.ndarray:
    column = _column(name, columns)
    if isinstance(column.dtype, pd.CategoricalDtype):
        column = pd.Series(np.asarray(column.astype(object)), index=column.index)
    if pd.api.types.is_bool_dtype(column):
        return column.to_numpy(dtype=np.float64)
    if not pd.api.types.is_numeric_dtype(column):
        raise UnsafeTermError(name, "is not numeric: use C() for it, or compare it with a "
                              "quoted level (name == 'level')")  # fmt: skip
    return column.to_numpy(dtype=np.float64)


def _levels(name: str, columns: Mapping[str, pd.Series]) -> np.ndarray:
    column = _column(name, columns)
    return np.asarray(column.astype(object)) if isinstance(column.dtype, pd.CategoricalDtype) \
        else column.to_numpy(dtype=object)  # fmt: skip


def _column(name: str, columns: Mapping[str, pd.Series]) -> pd.Series:
    if name not in columns:
        raise UnsafeTermError(name, "is not a column of the design")
    return columns[name]
