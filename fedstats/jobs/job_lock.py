"""An exclusive lock file for a scheduled job, so two runs of it never overlap.

The lock is ``fcntl.flock`` on a file in the job's working folder. The
kernel releases it when the holding process ends, however it ends, so a
lock file left by a crashed run holds no lock: the next run takes it over
and says so (the file still names the dead run's process id). A second run
while the first is alive gets :class:`JobAlreadyRunning` at once (it never
waits).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from fedstats.errors import JobAlreadyRunning


class JobLock:
    """Hold ``path`` exclusively for the duration of a ``with`` block.

    Attributes
    ----------
    previous_pid:
        The process id a stale lock file named (a run that ended without
        removing it), or ``None`` when the file was absent or empty.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.previous_pid: int | None = None
        self._fd: int | None = None

    def acquire(self) -> JobLock:
        """Take the lock or raise :class:`JobAlreadyRunning` naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise JobAlreadyRunning(
                f"{self.path}: another run holds the lock (process {holder or 'unknown'}); "
                "this run did nothing. Wait for it to end, or stop that process."
            ) from None
        self.previous_pid = _read_pid(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Empty the lock file and release the lock (the file stays, empty)."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> JobLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    return int(text) if text.isdigit() else None
