"""Text and HTML tables of fitted coefficients, in the statsmodels style."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import pandas as pd


def render_text(
    title: str, info: Sequence[tuple[str, str]], table: pd.DataFrame, notes: Sequence[str] = ()
) -> str:
    """A fixed-width summary: a header of facts in two columns, the table, then notes."""
    body = table.to_string(float_format=_fmt)
    width = max(len(line) for line in body.splitlines())
    width = max(width, len(title) + 4, 78)
    half = (len(info) + 1) // 2
    left, right = info[:half], info[half:]
    lines = ["=" * width, title.center(width), "=" * width]
    for i in range(half):
        a = _pair(left[i]) if i < len(left) else ""
        b = _pair(right[i]) if i < len(right) else ""
        lines.append(f"{a:<{width // 2}}{b}")
    lines += ["-" * width, body, "=" * width]
    lines += [f"Note: {n}" for n in notes]
    return "\n".join(lines)


def render_html(
    title: str, info: Sequence[tuple[str, str]], table: pd.DataFrame, notes: Sequence[str] = ()
) -> str:
    """The same content as :func:`render_text`, as an HTML fragment for Jupyter."""
    facts = "".join(
        f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
        for k, v in info
    )
    coef = table.to_html(float_format=_fmt, border=0, classes="fedstats-table")
    note_html = "".join(f"<p><em>Note:</em> {html.escape(n)}</p>" for n in notes)
    return (
        f"<div class='fedstats-summary'><h4>{html.escape(title)}</h4>"
        f"<table class='fedstats-info'>{facts}</table>{coef}{note_html}</div>"
    )


def _pair(item: tuple[str, str]) -> str:
    key, value = item
    return f"{key + ':':<22}{value}"


def _fmt(value: float) -> str:
    if not np.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4f}"
