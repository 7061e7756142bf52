"""``flower-supernode`` with a shorter idle poll, for studies whose rounds should take < 1 s.

Flower 1.41's SuperNode waits a fixed 3 s before asking the SuperLink again
when it found no message, and 0.5 s between looks for its ClientApp's reply
(``flwr.supernode.start_client_internal``; neither is configurable). A
fedstats fit sends a new message each Newton step, right after the last
reply, so the node is nearly always idle when it arrives and each round waits
~3 s. This launcher runs Flower's own ``flower_supernode`` entry point
unchanged except that those waits are capped at ``FEDSTATS_NODE_POLL_INTERVAL``
seconds (default 0.05: twenty requests per second to the SuperLink while idle).
All arguments are Flower's (``--superlink``, TLS, node authentication, ...).

The cap is applied only to the Flower version it was checked against
(:data:`CHECKED_FLWR_VERSION`); with another version the stock SuperNode
runs and a warning says so.

Usage::

    python -m fedstats.flower.supernode --superlink HOST:9092 --isolation process ...
"""

from __future__ import annotations

import os
import sys
import time as _time
import warnings
from types import ModuleType

import flwr
from flwr.supernode import start_client_internal
from flwr.supernode.cli import flower_supernode

CHECKED_FLWR_VERSION = "1.41.0"
POLL_ENV = "FEDSTATS_NODE_POLL_INTERVAL"
DEFAULT_POLL_INTERVAL = 0.05


class CappedClock(ModuleType):
    """The ``time`` module with ``sleep`` capped at ``cap`` seconds."""

    def __init__(self, cap: float) -> None:
        super().__init__("time")
        self.cap = cap

    def __getattr__(self, name: str) -> object:
        return getattr(_time, name)

    def sleep(self, seconds: float) -> None:
        _time.sleep(min(seconds, self.cap))


def poll_interval() -> float:
    """The cap from ``FEDSTATS_NODE_POLL_INTERVAL`` (0.005 to 3 seconds)."""
    raw = os.environ.get(POLL_ENV, str(DEFAULT_POLL_INTERVAL))
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{POLL_ENV} must be a number of seconds, got {raw!r}") from None
    if not 0.005 <= value <= 3:
        raise SystemExit(f"{POLL_ENV} must be between 0.005 and 3 seconds, got {value}")
    return value


def main() -> int | None:
    """Run Flower's SuperNode with the idle poll capped (see the module docstring)."""
    if flwr.__version__ == CHECKED_FLWR_VERSION:
        start_client_internal.time = CappedClock(poll_interval())  # type: ignore[assignment]
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
