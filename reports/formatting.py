"""How numbers appear in a report: one fixed format per kind of figure.

Epsilons are shown with four significant digits, trailing zeros kept
(``f"{x:#.4g}"``: 1.000, 0.9150, 12.50), so a figure in the report can be
compared with the ledger's value formatted the same way.
"""

from __future__ import annotations

import math
from datetime import datetime

from markupsafe import Markup, escape


def format_epsilon(value: float | None) -> str:
    """Four significant digits, trailing zeros kept; ``"not available"`` for ``None``."""
    if value is None:
        return "not available"
    return f"{value:#.4g}"


def format_delta(value: float | None) -> str:
    """E.g. ``1e-05``; ``"not available"`` for ``None``."""
    return "not available" if value is None else f"{value:.3g}"


def format_number(value: float | None, digits: int = 4) -> str:
    """``digits`` significant digits; an en dash for ``None`` or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}g}"


def format_count(value: float | None) -> str:
    """A count rounded to a whole number, thousands separated (noisy counts are not whole);
    an en dash for ``None`` or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{round(value):,}"


def format_share(value: float | None) -> str:
    """A share as a whole percentage, e.g. ``87%``; an en dash for ``None`` or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{100 * value:.0f}%"


def format_bytes(value: int) -> str:
    """Thousands separated, e.g. ``12,345``."""
    return f"{value:,}"


def format_time(value: datetime) -> str:
    """UTC time to the second, e.g. ``2026-01-31 14:05:09 UTC``."""
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


DIGEST_GROUP = 16
"""Hex digits per group when a digest is printed: a line breaks only between groups."""


def digest_html(value: object) -> Markup:
    """A hex digest in groups of :data:`DIGEST_GROUP` digits that a line may break between
    (never inside a group, so no digit is left alone on a line)."""
    text = str(value)
    groups = [escape(text[i : i + DIGEST_GROUP]) for i in range(0, len(text), DIGEST_GROUP)]
    return (
        Markup('<span class="digest-group">')
        + Markup('</span><wbr><span class="digest-group">').join(groups)
        + Markup("</span>")
    )
