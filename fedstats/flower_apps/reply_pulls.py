"""Replies pulled from a Flower grid one message at a time, each by its own daemon thread.

Flower's ``Grid.pull_messages`` (flwr 1.41, ``HttpGrid``) first *consumes*
the replies at the SuperLink (``PullMessages`` deletes them there), then
downloads each reply's objects in turn, retrying an object that is not
there yet with exponential backoff for up to ``PULL_MAX_TIME`` (7200 s) or
500 tries. When a site's SuperNode dies after announcing its reply but
before uploading all of its objects, that download waits minutes before it
gives up with ``MESSAGE_UNAVAILABLE`` — and every other reply returned by
the same call waits behind it. Pulled inline, one dead site then held the
coordinator far past its ``round_timeout`` and had a live site, whose reply
was consumed by the same call but not yet handed back, counted lost.

:class:`ReplyPulls` pulls every message by its own call in its own daemon
thread: a pull Flower cannot finish blocks no other reply, no deadline of
the coordinator, and never the ServerApp's exit. The runtime client is
already used from several threads at once by Flower itself
(``pull_objects`` downloads objects concurrently).
"""

from __future__ import annotations

import logging
import threading
import time

from flwr.app import Message
from flwr.serverapp import Grid

log = logging.getLogger(__name__)


class ReplyPulls:
    """Pulls of single replies in the background; their outcomes, by message id.

    :meth:`start` begins a pull of one message unless one is running or its
    outcome waits to be taken; :meth:`take` hands back the reply (or raises
    the pull's exception) once it is there; :meth:`drop` gives a message up:
    a pull still running for it is ignored when it ends.
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._outcomes: dict[str, Message | Exception] = {}
        self._finished_at: dict[str, float] = {}
        self._dropped: set[str] = set()

    def start(self, message_id: str, every: float = 0.0) -> bool:
        """Pull ``message_id`` in the background, at most once per ``every`` seconds; whether
        a pull was started."""
        with self._lock:
            if message_id in self._running or message_id in self._outcomes:
                return False
            if time.monotonic() - self._finished_at.get(message_id, -float("inf")) < every:
                return False
            self._running.add(message_id)
            self._dropped.discard(message_id)
        threading.Thread(
            target=self._pull, args=(message_id,), name="fedstats-pull", daemon=True
        ).start()
        return True

    def _pull(self, message_id: str) -> None:
        outcome: Message | Exception | None = None
        try:
            for reply in self.grid.pull_messages([message_id]):
                if reply.metadata.reply_to_message_id == message_id:
                    outcome = reply
        except Exception as error:  # noqa: BLE001 - re-raised to the waiter by take()
            outcome = error
        with self._lock:
            self._running.discard(message_id)
            self._finished_at[message_id] = time.monotonic()
            if message_id in self._dropped:
                self._dropped.discard(message_id)
                self._finished_at.pop(message_id, None)
                if outcome is not None:
                    log.info("reply to given-up message %s pulled late: ignored", message_id)
            elif outcome is not None:
                self._outcomes[message_id] = outcome

    def take(self, message_id: str) -> Message | None:
        """The reply pulled for ``message_id`` (``None``: none yet); a failed pull raises here."""
        with self._lock:
            outcome = self._outcomes.pop(message_id, None)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def running(self, message_id: str) -> bool:
        """Whether a pull of ``message_id`` is under way."""
        with self._lock:
            return message_id in self._running

    def drop(self, message_id: str) -> None:
        """Give ``message_id`` up: its outcome is discarded, now or when its pull ends."""
        with self._lock:
            self._outcomes.pop(message_id, None)
            self._finished_at.pop(message_id, None)
            if message_id in self._running:
                self._dropped.add(message_id)
