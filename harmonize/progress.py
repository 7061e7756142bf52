"""Progress of a harmonisation run, reported to an optional callback (e.g. a tqdm bar).

The callback receives the input records processed so far and the total when
it is known (a FHIR run counts its records in a first pass, so it reports
``(0, total)`` first, then every :data:`REPORT_EVERY` records, then
``(total, total)``; an OMOP run is read by DuckDB one table per statement,
so it reports only its final count). The callback is called from the
process that runs the harmonisation; the default is silence.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["REPORT_EVERY", "Progress", "ProgressCounter"]

REPORT_EVERY = 1_000
"""Records between two calls of the callback."""


class Progress(Protocol):
    """``progress(done, total)``: ``done`` input records processed, of ``total`` (or None)."""

    def __call__(self, done: int, total: int | None) -> None: ...


class ProgressCounter:
    """Counts processed records and calls ``callback`` every ``every`` records."""

    def __init__(
        self, callback: Progress | None, total: int | None = None, every: int = REPORT_EVERY
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        self.callback = callback
        self.total = total
        self.every = every
        self.done = 0
        self._next = every

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more records; report when another ``every`` records are done."""
        self.done += n
        if self.callback is not None and self.done >= self._next:
            self.callback(self.done, self.total)
            self._next = self.done - self.done % self.every + self.every

    def report(self) -> None:
        """Report the count now: at the start, and the final count at the end."""
        if self.callback is not None:
            self.callback(self.done, self.total)
