"""The SuperNode's wake-up of its worker: a byte through a named pipe, never a block."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fedstats.flower.task_wakeup import WakeReceiver, WakeSender, make_wake_pipe


def test_a_wake_reaches_the_waiting_worker_and_is_drained(tmp_path: Path) -> None:
    pipe = make_wake_pipe(tmp_path / "wake.fifo")
    receiver = WakeReceiver(pipe)
    sender = WakeSender(pipe)
    try:
        started = time.monotonic()
        assert receiver.wait(0.05) is False  # nothing sent: the full wait
        assert time.monotonic() - started >= 0.04
        for _ in range(3):
            sender.wake()
        started = time.monotonic()
        assert receiver.wait(5.0) is True
        assert time.monotonic() - started < 1.0
        assert receiver.wait(0.01) is False  # the three wake-ups were drained as one
    finally:
        receiver.close()


def test_waking_a_worker_that_is_not_there_neither_blocks_nor_fails(tmp_path: Path) -> None:
    pipe = make_wake_pipe(tmp_path / "wake.fifo")
    sender = WakeSender(pipe)
    started = time.monotonic()
    sender.wake()  # no reader: opening for writing would fail (ENXIO), so nothing is sent
    assert time.monotonic() - started < 0.5
    receiver = WakeReceiver(pipe)  # a worker that starts later is woken by the next message
    try:
        sender.wake()
        assert receiver.wait(1.0) is True
    finally:
        receiver.close()
    sender.wake()  # the worker went away again
    WakeSender(tmp_path / "missing.fifo").wake()  # no pipe at all


def test_a_worker_restarted_on_a_live_pipe_is_not_woken_by_the_old_writer(tmp_path: Path) -> None:
    """The worker opens the pipe for reading and writing: a closed writer end does not make
    every wait return at once (a pipe without writers reads as end of file)."""
    pipe = make_wake_pipe(tmp_path / "wake.fifo")
    receiver = WakeReceiver(pipe)
    try:
        sender = WakeSender(pipe)
        sender.wake()
        assert receiver.wait(1.0) is True
        assert sender._fd is not None
        os.close(sender._fd)  # the SuperNode exits
        assert receiver.wait(0.05) is False
    finally:
        receiver.close()
    assert make_wake_pipe(pipe) == pipe  # an existing pipe is kept
