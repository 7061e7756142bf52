"""A site's SuperNode wakes its worker when a task arrives, so the worker need not poll.

The long-lived site worker (:mod:`fedstats.flower_apps.site_worker`) learns of
a task by asking the SuperNode's Runtime API (``AcquireTask``, an HTTP call).
Asked every few milliseconds, that costs a share of a core per site while a
study runs and adds one poll interval to every round. Instead the SuperNode
launcher (:mod:`fedstats.flower.supernode`) writes one byte to a named pipe
in the site's Flower home each time it has stored a message with all its
objects, and the worker waits on the pipe: it asks the SuperNode at once when
woken, and otherwise only at its slow safety pace. Nothing but a wake-up
crosses the pipe: the task itself is still fetched from the SuperNode by
Flower's own calls, and a lost or spurious byte only moves an ask earlier or
later.

The pipe's path is given to the SuperNode launcher in :data:`WAKE_ENV` and to
the worker with ``--wake-pipe`` (:func:`fedstats.flower.processes.start_supernode`
does both).
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
from pathlib import Path

WAKE_ENV = "FEDSTATS_TASK_WAKE_PIPE"
"""The environment variable naming the pipe, for the SuperNode launcher."""
WAKE_FILE = "task-wake.fifo"
"""The pipe's file name in a site's Flower home."""


def make_wake_pipe(path: Path) -> Path:
    """Create the named pipe at ``path`` (kept if it already is one)."""
    if path.exists() and stat.S_ISFIFO(path.stat().st_mode):
        return path
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path, 0o600)
    return path


class WakeSender:
    """The SuperNode's end: :meth:`wake` writes one byte if a worker listens, never blocks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def wake(self) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no worker has the pipe open (ENXIO), or no pipe: nothing to wake
                return
        try:
            os.write(self._fd, b"\x01")
        except BlockingIOError:  # the pipe is full of unread wake-ups: the worker will ask
            pass
        except OSError:  # the worker went away: open again next time
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class WakeReceiver:
    """The worker's end: :meth:`wait` returns early, ``True``, when the SuperNode woke it.

    The pipe is opened for reading and writing, so it never reads as closed
    when the SuperNode restarts (a pipe with no writer would wake every wait).
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(make_wake_pipe(path), os.O_RDWR | os.O_NONBLOCK)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up; drain every byte waiting."""
        ready, _, _ = select.select([self._fd], [], [], max(timeout, 0.0))
        if not ready:
            return False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._fd, 4096):
                pass
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
