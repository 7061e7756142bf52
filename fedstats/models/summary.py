"""Text and HTML tables of fitted coefficients, in the statsmodels style.

A result's ``summary()`` is a :class:`Summary`: its text, which prints, writes and compares
as a ``str``, and which a notebook shows as the formatted table (statsmodels' ``Summary``
shows itself the same way), not as an escaped string full of ``\n``."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import pandas as pd


class Summary(str):
    """A summary's text (``print`` it, write it, search it) that displays as itself: its
    ``repr`` is the text and Jupyter renders its HTML (:meth:`_repr_html_`)."""

    _html: str

    def __new__(cls, text: str, html_fragment: str) -> Summary:
        summary = super().__new__(cls, text)
        summary._html = html_fragment
        return summary

    def __repr__(self) -> str:
        return str.__str__(self)

    def _repr_html_(self) -> str:
        return self._html

    def as_text(self) -> str:
        """The fixed-width text (statsmodels' ``Summary.as_text``)."""
        return str.__str__(self)

    def as_html(self) -> str:
        """The HTML fragment a notebook shows (statsmodels' ``Summary.as_html``)."""
        return self._html


def render_summary(
    title: str, info: Sequence[tuple[str, str]], table: pd.DataFrame, notes: Sequence[str] = ()
) -> Summary:
    """The text and HTML of one summary (:func:`render_text`, :func:`render_html`)."""
    return Summary(render_text(title, info, table, notes), render_html(title, info, table, notes))


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
