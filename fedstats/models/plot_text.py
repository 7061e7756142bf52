"""Text for matplotlib figures of fedstats results, shown as written.

Group levels, coefficient and site names come from the study's data and the
coordinator's formula; matplotlib reads a text holding two ``$`` as mathtext
(``$\\undefinedcommand{x}$`` makes the figure fail to draw). An escaped dollar
(``\\$``) is drawn as a dollar sign, so every such text passes through
:func:`literal` before it reaches an artist (tick labels are made when the
figure is drawn, after any settings of the moment have gone, so the text
itself is escaped). The compliance report draws its own figures with
mathtext switched off (:mod:`reports.plots`).
"""

from __future__ import annotations


def literal(text: object) -> str:
    """``str(text)`` with every ``$`` escaped, so matplotlib shows it rather than reading
    mathtext (with ``text.usetex`` off, matplotlib's default)."""
    return str(text).replace("$", r"\$")
