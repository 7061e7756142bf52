"""Harmonisation progress as log events: records done, of the total, and records per second.

:func:`harmonize.run.harmonize` calls its ``progress`` callback with the input
records processed so far and the total (:mod:`harmonize.progress`); this
callback turns each call into a ``harmonize.progress`` event
(:func:`fedstats.jobs.events.emit`), so ``--quiet`` silences it and
``--json-log`` prints it as one JSON object per line. On a terminal, without
either option, :class:`HarmonizationBar` shows a tqdm bar instead (records
done of the total, records per second, time left).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fedstats.jobs.events import emit

_log = logging.getLogger("fedstats.harmonize")


class HarmonizationProgress:
    """``progress(done, total)`` for one site's run; the rate counts from the first call.

    ``done`` counts input records read, not records that entered the frame (a run may read
    641 records and include 7 patients): the message says "read", and the report counts
    each record as included, excluded or rejected."""

    def __init__(self, site: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.site = site
        self._clock = clock
        self._started: float | None = None

    def __call__(self, done: int, total: int | None) -> None:
        now = self._clock()
        if self._started is None:
            self._started = now
        elapsed = now - self._started
        rate = done / elapsed if elapsed > 0 else None
        of_total = f" of {total:,}" if total is not None else ""
        per_second = f", {rate:,.0f} records/s" if rate is not None else ""
        emit(
            _log,
            "harmonize.progress",
            f"site {self.site}: {done:,}{of_total} records read{per_second} (each is "
            "included, excluded or rejected: the report counts them)",
            site=self.site,
            done=done,
            total=total,
            records_per_second=None if rate is None else round(rate, 1),
        )


class HarmonizationBar:
    """``progress(done, total)`` as a tqdm bar on stderr, for a person at a terminal."""

    def __init__(self, site: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(desc=f"harmonising {site}", unit=" records", unit_scale=True)

    def __call__(self, done: int, total: int | None) -> None:
        if total is not None and self._bar.total != total:
            self._bar.total = total
            self._bar.refresh()
        self._bar.update(done - self._bar.n)
        if total is not None and done >= total:
            self._bar.close()


def harmonization_progress(site: str) -> HarmonizationProgress | HarmonizationBar:
    """A bar when stderr is a terminal and progress is shown as plain text; else log events."""
    from fedstats.cli.logs import plain_progress_on_terminal

    return HarmonizationBar(site) if plain_progress_on_terminal() else HarmonizationProgress(site)
