"""Resource limits per request, checked before any work (and a deadline during it).

A coordinator may ask a site for arbitrary work: 100,000 local steps of a
network with millions of parameters, a grid of millions of points, arrays of
gigabytes. A site refuses such a request before reading a row, with a
:class:`~fedstats.errors.ResourceLimitError` naming the limit:

* ``max_request_bytes`` — the encoded request;
* ``max_array_items`` — the entries of all arrays in the request together;
* ``max_work`` — the work a task declares from its arguments
  (:attr:`fedstats.site.task.Task.cost`; for local training, local steps times the
  network's parameters);
* ``max_seconds`` — wall time: long-running handlers check the request's
  deadline (:func:`check_deadline`) between steps and stop with nothing
  released when it has passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.errors import ResourceLimitError, StudyConfigurationError


@dataclass(frozen=True)
class RequestLimits:
    """What a site allows one request (defaults suit a hospital's batch server)."""

    max_seconds: float = 900.0
    max_request_bytes: int = 256 * 2**20
    max_array_items: int = 20_000_000
    max_work: float = 5e9
    """Local training steps x network parameters (2,000 steps of a 2.5M-parameter network)."""

    def __post_init__(self) -> None:
        for name in ("max_seconds", "max_request_bytes", "max_array_items", "max_work"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise StudyConfigurationError(f"{name} must be a positive number, got {value!r}")

    def check_request(self, site: str, task: str, request: bytes) -> None:
        """Refuse an encoded request larger than ``max_request_bytes``."""
        if len(request) > self.max_request_bytes:
            raise ResourceLimitError(
                site=site,
                task=task,
                limit="max_request_bytes",
                reason=f"the request has {len(request)} bytes, more than {self.max_request_bytes}",
            )

    def check_arguments(self, site: str, task: str, args: dict[str, Any]) -> None:
        """Refuse arrays with more than ``max_array_items`` entries in all."""
        items = sum(_array_items(value) for value in args.values())
        if items > self.max_array_items:
            raise ResourceLimitError(
                site=site,
                task=task,
                limit="max_array_items",
                reason=f"the request's arrays hold {items} values, "
                f"more than {self.max_array_items}",
            )

    def check_work(self, site: str, task: str, work: float) -> None:
        """Refuse a task whose declared work exceeds ``max_work``."""
        if work > self.max_work:
            raise ResourceLimitError(
                site=site,
                task=task,
                limit="max_work",
                reason=f"the request asks for {work:.3g} units of work (local steps x parameters), "
                f"more than {self.max_work:.3g}",
            )

    def deadline(self) -> float:
        """The ``time.monotonic()`` value by which a request starting now must be answered."""
        return time.monotonic() + self.max_seconds


def check_deadline(deadline: float | None, *, task: str) -> None:
    """Stop a long-running handler whose request has run out of time (nothing is released).

    The site names itself when the silo locates the error.
    """
    if deadline is not None and time.monotonic() > deadline:
        raise ResourceLimitError(
            site=None,
            task=task,
            limit="max_seconds",
            reason="the request ran out of its wall time; nothing was released",
        )


def _array_items(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.size)
    if isinstance(value, dict):
        return sum(_array_items(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_array_items(v) for v in value) + len(value)
    return 0
