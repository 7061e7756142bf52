"""The report's figures, drawn with matplotlib's Agg backend and embedded as PNG data URIs.

Embedding keeps the HTML self-contained (no file or network reference) and
WeasyPrint reads the same data URIs for the PDF.

Every text in a figure is drawn literally: term names, level labels, fit and
site names come from the study's records, and matplotlib would otherwise read
``$...$`` as mathtext (an unknown command such as ``$\\undefinedcommand{x}$``
made the report fail to build) or hand text to TeX. Each figure is made and
saved under :data:`LITERAL_TEXT` (``text.parse_math`` off, ``text.usetex``
off), which every text artist created or drawn inside it inherits.

matplotlib is imported when a figure is drawn, not with the module: only
building a report draws.
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LITERAL_TEXT = {"text.parse_math": False, "text.usetex": False}
"""matplotlib settings under which every figure is drawn: text is shown as written."""

P = ParamSpec("P")
R = TypeVar("R")


def literal_text(draw: Callable[P, R]) -> Callable[P, R]:
    """Run a figure function with :data:`LITERAL_TEXT` (creation and saving alike)."""

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        import matplotlib

        with matplotlib.rc_context(LITERAL_TEXT):
            return draw(*args, **kwargs)

    return drawn


def _data_uri(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=130, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@literal_text
def epsilon_timeline(
    series: Sequence[tuple[str, str, Sequence[tuple[datetime, float]], float]],
) -> str | None:
    """Cumulative RDP epsilon per scope, as recorded after each charge, in order of commit time.

    ``series``: ``(scope owner, level, [(time, epsilon_after), ...], budget)`` per scope.
    The horizontal axis ranks every scope's charges together by commit time
    (charges of one fit may fall within a second, so a time axis would stack
    them); each scope is a step line from zero, labelled in the legend with
    its owner and level. Each budget cap is a dashed line labelled with its
    value and the scopes it caps (scopes sharing a cap share one line).
    ``None`` when no scope has an entry.
    """
    drawn = [(owner, level, points, budget) for owner, level, points, budget in series if points]
    if not drawn:
        return None
    from matplotlib.figure import Figure

    times = sorted(t for _, _, points, _ in drawn for t, _ in points)
    rank = {t: i + 1 for i, t in reversed(list(enumerate(times)))}
    figure = Figure(figsize=(7.5, 3.8))
    ax = figure.subplots()
    caps: dict[float, list[str]] = {}
    for index, (owner, level, points, budget) in enumerate(drawn):
        steps = [0, *(rank[t] for t, _ in points)]
        values = [0.0, *(e for _, e in points)]
        ax.step(
            steps,
            values,
            where="post",
            marker="o",
            markersize=3,
            color=f"C{index % 10}",
            label=f"{owner} ({level}): spent",
        )
        caps.setdefault(budget, []).append(owner)
    for budget, owners in sorted(caps.items()):
        ax.axhline(budget, color="dimgrey", linestyle="--", linewidth=0.9)
        ax.annotate(
            f"budget cap ε = {budget:#.4g}: {', '.join(owners)}",
            xy=(1.0, budget),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color="dimgrey",
        )
    first, last = (t.strftime("%Y-%m-%d %H:%M:%S") for t in (times[0], times[-1]))
    ax.set_xlabel(f"charges in order of commit time (first {first}, last {last} UTC)")
    ax.set_ylabel("cumulative ε (RDP)")
    ax.set_ylim(0, 1.15 * max([*caps, *(e for *_, points, _ in drawn for _, e in points)]))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=3, frameon=False)
    ax.set_title("Cumulative ε per scope (dashed: each budget cap)", fontsize=10)
    return _data_uri(figure)


@literal_text
def coefficient_comparison(
    terms: Sequence[str],
    estimate: Sequence[tuple[float, float, float]],
    reference: Sequence[tuple[float, float, float]],
    labels: tuple[str, str],
) -> str:
    """Estimates with confidence intervals of a fit beside its reference fit, term by term.

    ``estimate`` and ``reference``: ``(coef, lower, upper)`` per term.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 0.45 * len(terms) + 1.2))
    ax = figure.subplots()
    rows = list(range(len(terms)))[::-1]
    for offset, values, label, colour in (
        (0.15, reference, labels[1], "black"),
        (-0.15, estimate, labels[0], "tab:red"),
    ):
        centre = [v[0] for v in values]
        errors = [[v[0] - v[1] for v in values], [v[2] - v[0] for v in values]]
        ax.errorbar(
            centre,
            [r + offset for r in rows],
            xerr=errors,
            fmt="o",
            capsize=3,
            color=colour,
            label=label,
        )
    ax.axvline(0.0, color="grey", linewidth=0.6)
    ax.set_yticks(rows, labels=list(terms))
    ax.set_xlabel("coefficient (log odds or log hazard) with confidence interval")
    ax.legend(fontsize=7, loc="best")
    return _data_uri(figure)


@literal_text
def score_histogram(bins: Sequence[tuple[float, float, int | None]], k: int) -> str:
    """Linked pairs by Dice score, one bar per bin from the threshold to 1.

    ``bins``: ``(low, high, count)`` per bin, lowest first; a count of ``None`` is not drawn
    (suppressed or withheld): its bin is labelled ``< k`` or ``withheld`` instead of a bar,
    so the figure shows no more than the report's table.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.5, 2.8))
    ax = figure.subplots()
    width = min(high - low for low, high, _ in bins)
    shown = [(low, count) for low, _, count in bins if count is not None]
    ax.bar(
        [low for low, _ in shown],
        [count for _, count in shown],
        width=width,
        align="edge",
        color="C0",
        edgecolor="white",
    )
    top = max([count for _, count in shown] + [k])
    for low, high, count in bins:
        if count is None:
            ax.annotate(
                "hidden",
                xy=((low + high) / 2, 0),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
                color="dimgrey",
                rotation=90,
            )
    ax.set_xlim(bins[0][0], bins[-1][1])
    ax.set_ylim(0, 1.15 * top)
    ax.set_xlabel("Dice similarity of the linked pair (from the threshold to 1)")
    ax.set_ylabel("linked pairs")
    ax.set_title(f"Linked pairs by match score (hidden: fewer than {k}, or withheld)", fontsize=10)
    return _data_uri(figure)
