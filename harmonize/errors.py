"""Domain errors of :mod:`harmonize`, each naming the file, line or field and what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harmonize.report import HarmonizationReport


class HarmonizationError(Exception):
    """Base class of every error this package raises on purpose."""


class SpecError(HarmonizationError):
    """The study specification is unreadable or invalid; ``problems`` lists each field's issue."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class UnitError(HarmonizationError):
    """A unit is unknown, or cannot be converted to the one the study asks for."""


class HarmonizationFailed(HarmonizationError):
    """The run failed; ``report`` says how far it got and why."""

    def __init__(self, message: str, report: HarmonizationReport) -> None:
        super().__init__(message)
        self.report = report
