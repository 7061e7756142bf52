"""Resource limits per request, checked before any work (and a deadline during it).

A coordinator may ask a site for arbitrary work: 100,000 local steps of a
network with millions of parameters, a grid of millions of points, arrays of
gigabytes, a design of 100,000 agreed levels. A site refuses such a request
before reading a row, with a :class:`~fedstats.errors.ResourceLimitError`
naming the limit. Each limit is computed from the request alone, before the
work it bounds (:meth:`fedstats.site.silo.Silo.handle` checks them first):

* ``max_request_bytes`` — the encoded request, before it is decoded;
* ``max_header_bytes`` — the request's JSON header (:mod:`fedstats.contract.codec`),
  from the length its first eight bytes declare, before it is parsed;
* ``max_design_columns`` — the design columns the request's agreed levels
  imply (:func:`design_width`), before any design is built;
* ``max_array_items`` — the entries of all arrays in the request together;
* ``max_work`` — the work a task declares from its arguments
  (:attr:`fedstats.site.task.Task.cost`; for local training, the examples it passes
  through the network times the network's parameters);
* ``max_seconds`` — wall time: long-running handlers check the request's
  deadline (:func:`check_deadline`) between steps and stop with nothing
  released when it has passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.contract import codec
from fedstats.contract.design import parse_formula
from fedstats.errors import FormulaError, ResourceLimitError, StudyConfigurationError


@dataclass(frozen=True)
class RequestLimits:
    """What a site allows one request (defaults suit a hospital's batch server)."""

    max_seconds: float = 900.0
    max_request_bytes: int = 64 * 2**20
    max_header_bytes: int = 512 * 2**10
    """The JSON header holds names, levels and options (arrays travel as buffers): the
    heart-disease study's largest is a few kilobytes; a 64 MB header cost 17.6 s to parse,
    and a 2 MB one of 350,000 names 2.3 s to parse and refuse."""
    max_design_columns: int = 1_000
    """Twenty categorical variables of 50 levels each; at Cleveland's 303 rows a design of
    2,000 columns cost 1.7 s a request, and one of 100,000 agreed levels 18.7 s and 1 GB."""
    max_array_items: int = 6_000_000
    """Above the largest network a request may describe (5M parameters,
    :data:`fedstats.deep.shared.models.MAX_PARAMETERS`), whose weights travel as arrays."""
    max_work: float = 2e8
    """Local training examples x network parameters (steps x rows per step x parameters):
    100 steps of 32 rows through a 60,000-parameter network. The largest request this allows
    costs about a second on one core (``benchmarks/worst_request.py``); a site that trains
    bigger networks raises it."""

    def __post_init__(self) -> None:
        for name in (
            "max_seconds",
            "max_request_bytes",
            "max_header_bytes",
            "max_design_columns",
            "max_array_items",
            "max_work",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise StudyConfigurationError(f"{name} must be a positive number, got {value!r}")

    def check_request(self, site: str, task: str, request: bytes) -> None:
        """Refuse an encoded request larger than ``max_request_bytes``, or whose header is
        longer than ``max_header_bytes``: both read from its length and first eight bytes,
        before anything is decoded."""
        if len(request) > self.max_request_bytes:
            raise ResourceLimitError(
                site=site,
                task=task,
                limit="max_request_bytes",
                reason=f"the request has {len(request)} bytes, more than {self.max_request_bytes}",
            )
        header = codec.header_length(request)
        if header is not None and header > self.max_header_bytes:
            raise ResourceLimitError(
                site=site,
                task=task,
                limit="max_header_bytes",
                reason=f"the request's header has {header} bytes, more than "
                f"{self.max_header_bytes}",
            )

    def check_design(self, site: str, task: str, args: dict[str, Any]) -> None:
        """Refuse a design whose agreed levels imply more than ``max_design_columns`` columns
        (:func:`design_width`), before any design is built."""
        width = design_width(args.get("design"))
        if width > self.max_design_columns:
            raise ResourceLimitError(
                site=site,
                task=task,
                limit="max_design_columns",
                reason=f"the request's design and its agreed levels make up to {width} "
                f"columns, more than {self.max_design_columns}",
            )

    def check_arguments(self, site: str, task: str, args: dict[str, Any]) -> None:
        """Refuse arrays with more than ``max_array_items`` entries in all."""
        items = sum(_array_items(value) for value in args.values())
        if items > self.max_array_items:
            raise ResourceLimitError(
                site=site,
                task=task,
                limit="max_array_items",
                reason=f"the request's arrays hold {items} values, "
                f"more than {self.max_array_items}",
            )

    def check_work(self, site: str, task: str, work: float) -> None:
        """Refuse a task whose declared work exceeds ``max_work``."""
        if work > self.max_work:
            raise ResourceLimitError(
                site=site,
                task=task,
                limit="max_work",
                reason=f"the request asks for {work:.3g} units of work (examples x parameters), "
                f"more than {self.max_work:.3g}",
            )

    def deadline(self) -> float:
        """The ``time.monotonic()`` value by which a request starting now must be answered."""
        return time.monotonic() + self.max_seconds


def check_deadline(deadline: float | None, *, task: str) -> None:
    """Stop a long-running handler whose request has run out of time (nothing is released).

    The site names itself when the silo locates the error.
    """
    if deadline is not None and time.monotonic() > deadline:
        raise ResourceLimitError(
            site=None,
            task=task,
            limit="max_seconds",
            reason="the request ran out of its wall time; nothing was released",
        )


def design_width(design: Any) -> int:
    """The most design columns a request's ``design`` can make, from the request alone.

    ``max(declared columns, intercepts + sum over terms of the product over the term's
    categorical factors of their agreed levels)``: full dummy coding of every categorical
    factor bounds what formulaic builds (reduced coding drops one level per factor), and a
    numeric factor is one column. The formula is read by the grammar, never evaluated; a
    design that is not even a mapping, or whose formula does not parse, counts its declared
    columns (the task refuses it before any work).
    """
    if not isinstance(design, dict):
        return 0
    declared = design.get("columns")
    width = len(declared) if isinstance(declared, list) else 0
    levels = design.get("levels")
    levels = levels if isinstance(levels, dict) else {}
    try:
        parsed = parse_formula(design.get("formula"))
    except FormulaError:
        return width
    sites = design.get("sites")
    intercepts = (
        len(sites) if design.get("site_intercepts") is True and isinstance(sites, list) else 1
    )
    implied = intercepts
    for term in parsed.terms:
        cells = 1
        for factor in term:
            if factor.kind in ("column", "categorical"):
                agreed = levels.get(factor.column)
                cells *= len(agreed) if isinstance(agreed, list) and agreed else 1
        implied += cells
    return max(width, implied)


def _array_items(value: Any) -> int:
    if isinstance(value, dict):
        return sum(map(_array_items, value.values()))
    if isinstance(value, list | tuple):
        return sum(map(_array_items, value)) + len(value)
    if isinstance(value, np.ndarray):
        return int(value.size)
    return 0
