"""Domain errors of :mod:`harmonize`, each naming the file, line or field and what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from harmonize.report import HarmonizationReport


class HarmonizationError(Exception):
    """Base class of every error this package raises on purpose."""


class SpecError(HarmonizationError):
    """The study specification is unreadable or invalid; ``problems`` lists each field's issue."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class BundleTooDeep(HarmonizationError):
    """A FHIR Bundle holds Bundles nested deeper than the reader walks."""


class UnitError(HarmonizationError):
    """A unit is unknown, or cannot be converted to the one the study asks for."""


class HarmonizationFailed(HarmonizationError):
    """The run failed; ``report`` says how far it got and why, ``quarantine`` what it rejected.

    ``quarantine`` is the record store's ``rejected`` table when the run
    got as far as reading (a DataFrame), else None.
    """

    def __init__(
        self, message: str, report: HarmonizationReport, quarantine: pd.DataFrame | None = None
    ) -> None:
        super().__init__(message)
        self.report = report
        self.quarantine = quarantine
