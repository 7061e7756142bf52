"""Progress and outcome events of the jobs, as standard ``logging`` records.

A job calls :func:`emit` at each step (``study.submitted``, ``site.request``,
...); the record carries the event's name and its fields, so the command line
can print it as a line of text or as one JSON object
(:mod:`fedstats.cli.logs`), and a program embedding a job can attach its own
``logging`` handler. Nothing is printed unless a handler is configured.
"""

from __future__ import annotations

import logging
from typing import Any


def emit(logger: logging.Logger, event: str, message: str, **fields: Any) -> None:
    """Log ``message`` at INFO with ``event`` and ``fields`` attached to the record."""
    logger.info(message, extra={"event": event, "fields": fields})
