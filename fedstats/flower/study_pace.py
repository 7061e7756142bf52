"""How often a study's Flower processes ask for work, and the Flower version that was checked.

A site's SuperNode (:mod:`fedstats.flower.supernode`), its long-lived worker
(:mod:`fedstats.flower_apps.site_worker`) and the coordinator's ServerApp
(:mod:`fedstats.flower_apps.coordinator_app`) wait between their asks at the pace of
:class:`StudyPace`, and pull message objects at :data:`OBJECT_PULL_BACKOFF`. This module
holds only those waits, so a process that paces itself loads none of Flower's SuperNode
(its state database and web server).
"""

from __future__ import annotations

import functools
import time as _time
from collections.abc import Callable
from types import ModuleType

import flwr

CHECKED_FLWR_VERSION = "1.41.0"
DEFAULT_POLL_INTERVAL = 0.005
"""Seconds before the node's first ask of the SuperLink after it served a message."""
ACTIVE_POLL_CAP = 0.08
"""The longest wait between asks while a study is active (the wait doubles up to it)."""
IDLE_POLL_INTERVAL = 1.0
"""Seconds between asks once no message came for :data:`ACTIVE_WINDOW` seconds."""
ACTIVE_WINDOW = 30.0
"""Seconds after the last message during which a node or site worker asks at the fast pace."""
OBJECT_PULL_BACKOFF = (0.005, 0.05)
"""First and largest wait (s) between tries to pull a message object that is not there yet."""


class StudyPace:
    """How long to wait before the next ask.

    After activity (:meth:`active`) the wait starts at ``fast`` seconds and
    doubles at every ask that finds nothing, up to ``cap``: a message that
    follows the last one closely (the next Newton step) waits a few
    milliseconds, one that comes later waits at most ``cap``, and a node
    waiting for its next request asks ``1 / cap`` times a second, not
    ``1 / fast``. ``window`` seconds after the last activity (and before any)
    the wait is ``idle`` seconds.
    """

    def __init__(
        self,
        fast: float,
        cap: float = ACTIVE_POLL_CAP,
        idle: float = IDLE_POLL_INTERVAL,
        window: float = ACTIVE_WINDOW,
        clock: Callable[[], float] = _time.monotonic,
    ) -> None:
        self.fast, self.clock, self.window = fast, clock, window
        self.cap = max(cap, fast)
        self.idle = max(idle, self.cap)
        self.last_active = -float("inf")
        self._next = fast

    def active(self) -> None:
        """Something was served: start again at the fast pace."""
        self.last_active = self.clock()
        self._next = self.fast

    def interval(self) -> float:
        """Seconds to wait before the next ask (each call is one ask that found nothing)."""
        if self.clock() - self.last_active >= self.window:
            return self.idle
        wait = self._next
        self._next = min(2 * wait, self.cap)
        return wait


def quick_object_pulls(module: ModuleType) -> None:
    """Make ``module``'s ``pull_objects`` retry after :data:`OBJECT_PULL_BACKOFF`.

    Flower passes no backoff where it calls ``pull_objects`` (the SuperNode's
    message pull, the ServerApp grid's reply pull), so the default 1 s first
    wait applies; the number of tries per object (500) and the time limit stay
    Flower's, so an object that never comes fails after about 25 s, not hours.
    """
    pull = module.pull_objects
    if getattr(pull, "fedstats_quick", False):
        return
    first, cap = OBJECT_PULL_BACKOFF
    quick = functools.partial(pull, initial_backoff=first, backoff_cap=cap)
    quick.fedstats_quick = True  # type: ignore[attr-defined]
    module.pull_objects = quick


def checked_flower() -> bool:
    """Whether the installed Flower is the version the waits were checked against."""
    return flwr.__version__ == CHECKED_FLWR_VERSION
