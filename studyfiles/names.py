"""Names that become file and folder names: sites, studies, fits, curves, audits, ledgers.

One rule for every writer and reader of a study's files: a name is 1 to 100
letters, digits, ``.``, ``_`` or ``-``, starts with a letter or digit and does
not end with ``.``. So ``.`` and ``..`` (the folder itself and its parent),
hidden files (``.x``), a trailing dot (Windows drops it: ``a.`` is ``a``),
path separators (``/``, ``\\``), drive letters (``C:``), NUL and newlines can
never be a name: a site or fit named ``..`` would otherwise write its record
outside the study directory, and a name with a newline would forge a line of
a log or a report.
"""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9_-])?$"
"""The pattern every name matches."""

NAME_RULE = (
    "1-100 letters, digits, '.', '_' or '-', starting with a letter or digit and not ending "
    "with '.'"
)
"""The rule in words, for error messages."""

_NAME = re.compile(NAME_PATTERN)


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a file or folder name, or ``None`` when it can.

    Callers raise their own typed error (naming the file and the field) with
    this reason, so every layer refuses the same names for the same reason.
    """
    if not isinstance(name, str):
        return f"a name must be a string, got {type(name).__name__}"
    if _NAME.fullmatch(name) is None:
        return f"{name[:120]!r} is not a safe name: use {NAME_RULE}"
    return None
