"""``flower-supernode`` that answers within milliseconds while a study runs and idles cheaply.

Flower 1.41's SuperNode waits a fixed 3 s before asking the SuperLink again
when it found no message, and 0.5 s between looks for its ClientApp's reply
(``flwr.supernode.start_client_internal``; neither is configurable); and
every Flower process waits 1 s, doubling up to 10 s, before it asks again
for a message object that is not there yet (``flwr.supercore.inflatable``:
``pull_objects``), which a message announced before its objects are uploaded
nearly always meets. A fedstats fit sends a new message each Newton step,
right after the last reply, so with these waits each round takes seconds.

This launcher runs Flower's own ``flower_supernode`` entry point unchanged except for
those waits (their values and :class:`StudyPace` are in :mod:`fedstats.flower.study_pace`):

* :class:`StudyPace`: after the node served a message it asks the SuperLink
  again after ``FEDSTATS_NODE_POLL_INTERVAL`` seconds (default
  :data:`DEFAULT_POLL_INTERVAL`), the wait doubling up to :data:`ACTIVE_POLL_CAP`;
  :data:`ACTIVE_WINDOW` seconds after the last message it asks every
  :data:`IDLE_POLL_INTERVAL` seconds, so an idle site costs well under 2 % of
  a core (``benchmarks/flower.py``: ``idle_site_cpu_percent``) and the first
  message of a study waits at most that long;
* :func:`quick_object_pulls`: object pulls retry after
  :data:`OBJECT_PULL_BACKOFF` (5 ms, doubling to 50 ms), not 1 s to 10 s;
* :func:`wake_worker_on_each_message`: with ``FEDSTATS_TASK_WAKE_PIPE`` set,
  the node wakes the site worker through that pipe as soon as a message and
  its objects are stored (:mod:`fedstats.flower.task_wakeup`), so the worker
  does not poll for tasks.

The changes apply only to the Flower version they were checked against
(:data:`CHECKED_FLWR_VERSION`); with another version the stock SuperNode
runs and a warning says so. The coordinator's ServerApp applies
:func:`quick_object_pulls` to its grid the same way, and the site worker
(:mod:`fedstats.flower_apps.site_worker`) paces its own asks with a
:class:`StudyPace`.

Usage::

    python -m fedstats.flower.supernode --superlink HOST:9092 --isolation process ...
"""

from __future__ import annotations

import functools
import os
import sys
import time as _time
import warnings
from pathlib import Path
from types import ModuleType

import flwr
from flwr.common.logger import update_console_handler
from flwr.supernode import start_client_internal
from flwr.supernode.cli import flower_supernode

from fedstats.flower.study_pace import (
    CHECKED_FLWR_VERSION,
    DEFAULT_POLL_INTERVAL,
    StudyPace,
    checked_flower,
    quick_object_pulls,
)
from fedstats.flower.task_wakeup import WAKE_ENV, WakeSender

POLL_ENV = "FEDSTATS_NODE_POLL_INTERVAL"
_FLOWER_IDLE_SLEEP = 3
"""The wait Flower's SuperNode loop asks for when it found no message."""


class PacedClock(ModuleType):
    """The ``time`` module of Flower's SuperNode loop, its waits set by a :class:`StudyPace`.

    The loop asks for :data:`_FLOWER_IDLE_SLEEP` seconds when the SuperLink had
    no message; any other wait (for the ClientApp's reply, for an object) means
    a message is being served, and is capped at the fast pace.
    """

    def __init__(self, pace: StudyPace) -> None:
        super().__init__("time")
        self.pace = pace

    def __getattr__(self, name: str) -> object:
        return getattr(_time, name)

    def sleep(self, seconds: float) -> None:
        if seconds >= _FLOWER_IDLE_SLEEP:
            _time.sleep(min(seconds, self.pace.interval()))
        else:
            self.pace.active()
            _time.sleep(min(seconds, self.pace.fast))


def poll_interval() -> float:
    """The fast pace from ``FEDSTATS_NODE_POLL_INTERVAL`` (0.005 to 3 seconds)."""
    raw = os.environ.get(POLL_ENV, str(DEFAULT_POLL_INTERVAL))
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{POLL_ENV} must be a number of seconds, got {raw!r}") from None
    if not 0.005 <= value <= 3:
        raise SystemExit(f"{POLL_ENV} must be between 0.005 and 3 seconds, got {value}")
    return value


def wake_worker_on_each_message(module: ModuleType, sender: WakeSender) -> None:
    """Make ``module``'s ``_pull_and_store_message`` wake the site worker once it has stored
    a message with all its objects (:mod:`fedstats.flower.task_wakeup`)."""
    pull_and_store = module._pull_and_store_message

    @functools.wraps(pull_and_store)
    def pull_store_and_wake(*args: object, **kwargs: object) -> int | None:
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:
            sender.wake()
        return run_id

    module._pull_and_store_message = pull_store_and_wake


def main() -> int | None:
    """Run Flower's SuperNode with the study's pace (see the module docstring)."""
    update_console_handler(timestamps=True, colored=False)  # a site's log file, read later
    if checked_flower():
        start_client_internal.time = PacedClock(StudyPace(poll_interval()))  # type: ignore[assignment]
        quick_object_pulls(start_client_internal)
        pipe = os.environ.get(WAKE_ENV)
        if pipe:
            wake_worker_on_each_message(start_client_internal, WakeSender(Path(pipe)))
    else:
        warnings.warn(
            f"flwr {flwr.__version__} is not {CHECKED_FLWR_VERSION}: running the stock SuperNode "
            "(idle poll 3 s)",
            stacklevel=1,
        )
    sys.argv[0] = "flower-supernode"
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())
