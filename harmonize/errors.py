"""Domain errors of :mod:`harmonize`, each naming the file, line or field and what to do."""

from __future__ import annotations


class HarmonizationError(Exception):
    """Base class of every error this package raises on purpose."""


class SpecError(HarmonizationError):
    """The study specification is unreadable or invalid; ``problems`` lists each field's issue."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])
