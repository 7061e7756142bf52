"""The site's durable record of every request it answered, reconciled with its ledger.

The silo charges the site's ledger *before* it releases a private reply. To
show afterwards that no charge lacks its released reply and no private
release lacks its charge, the site writes two lines per request to an
append-only JSON-lines journal, each flushed to disk (``fsync``) before it
goes on: ``received`` (task, request digest, ledger entry count) before the
silo runs, ``answered`` (status, reply digest, whether the reply was a
private release, ledger entry count) after, before the reply leaves the
site. A crash between the two leaves a ``received`` line alone; the next
start rolls it forward (:meth:`SiteJournal.roll_forward`) with a
``rolled_forward`` line stating the charges made for a reply that never
left. :func:`reconcile` checks the journal against the ledger.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import accounting

JOURNAL_FILE = "journal.jsonl"


def ledger_entry_count(ledger: accounting.Ledger | None) -> int:
    """How many charges the ledger holds, over all its scopes.

    Read from the scopes' stored counts (one query), not by reading every entry: the
    ledger checked each count against its entries when it was opened and checks it
    again before each charge.
    """
    if ledger is None:
        return 0
    return sum(head.entries for head in ledger.heads())


def digest(data: bytes) -> str:
    """The sha256 of a message, as recorded in the journal (never the message itself)."""
    return hashlib.sha256(data).hexdigest()


class JournalTail:
    """Reads a journal as it grows: each :meth:`new_records` returns the complete lines written
    since the previous call, reading only the bytes appended since (a serving loop that re-read
    the whole journal at every change would read it n times over n requests). A torn last line
    is left for the next call; once a later append completes it, it is skipped as
    :meth:`SiteJournal.records` skips it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        """Bytes of the journal read so far (up to the end of its last complete line)."""
        self.bytes_read = 0
        """Bytes read from the file over every call (for tests of the reading cost)."""

    def new_records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        if self.path.stat().st_size < self.offset:  # replaced by a shorter file: read it anew
            self.offset = 0
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        self.bytes_read += len(data)
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        self.bytes_read -= len(data) - len(complete)  # the torn tail is read again next time
        out = []
        for line in complete.decode("utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


class SiteJournal:
    """An append-only journal file of requests and replies (digests and sizes, no content)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._seq_tail: JournalTail | None = None
        self._last_seq = 0

    def records(self) -> list[dict[str, Any]]:
        """Every complete line; a torn last line (a crash mid-write) is ignored."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def tail(self) -> JournalTail:
        """A reader of the lines appended from now on (:class:`JournalTail`)."""
        return JournalTail(self.path)

    def append(self, record: dict[str, Any]) -> None:
        """Write one line and force it to disk before returning."""
        line = json.dumps({**record, "at": datetime.now(UTC).isoformat()}, sort_keys=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write("\n" + line + "\n" if self._torn() else line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _torn(self) -> bool:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return False
        with self.path.open("rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"

    def next_seq(self) -> int:
        """The sequence number for the next request: one more than the largest in the journal,
        read incrementally (each request reads only the lines appended since the last; lines
        another process appended are read too)."""
        if self._seq_tail is None:
            self._seq_tail = self.tail()
        for record in self._seq_tail.new_records():
            self._last_seq = max(self._last_seq, record.get("seq", 0))
        return 1 + self._last_seq

    def pending(self) -> list[dict[str, Any]]:
        """``received`` lines with no ``answered`` or ``rolled_forward`` line (crashed requests)."""
        records = self.records()
        closed = {r["seq"] for r in records if r.get("event") in ("answered", "rolled_forward")}
        return [r for r in records if r.get("event") == "received" and r["seq"] not in closed]

    def roll_forward(self, ledger: accounting.Ledger | None) -> int:
        """Close every crashed request, attributing to it the charges made since it arrived.

        Returns how many were closed. Their replies never left the site; any
        charge made for them stays spent (the conservative direction).
        """
        pending = self.pending()
        now = ledger_entry_count(ledger)
        for record in pending:
            self.append(
                {
                    "event": "rolled_forward",
                    "seq": record["seq"],
                    "task": record.get("task", "?"),
                    "status": "not released (the site stopped before replying)",
                    "ledger_entries": now,
                }
            )
        return len(pending)


@dataclass
class Reconciliation:
    """What :func:`reconcile` found; ``ok``: no release lacks a charge, no charge is unexplained."""

    requests: int = 0
    released: int = 0
    private_released: int = 0
    refused: int = 0
    charges: int = 0
    unreleased_charges: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_record(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "requests": self.requests,
            "released": self.released,
            "private_released": self.private_released,
            "refused": self.refused,
            "charges": self.charges,
            "charged_not_released": self.unreleased_charges,
            "problems": self.problems,
        }


def reconcile(journal: SiteJournal, ledger: accounting.Ledger | None) -> Reconciliation:
    """Check the journal against the ledger.

    Every ledger charge must fall within one journal request (between its
    ``received`` and ``answered``/``rolled_forward`` counts); every private
    release must have been charged; charges of requests that released
    nothing are listed (``charged_not_released``), never hidden.
    """
    result = Reconciliation()
    by_seq: dict[int, dict[str, dict[str, Any]]] = {}
    for record in journal.records():
        by_seq.setdefault(record["seq"], {})[record["event"]] = record
    explained = 0
    for seq in sorted(by_seq):
        events = by_seq[seq]
        received = events.get("received")
        closed = events.get("answered") or events.get("rolled_forward")
        if received is None:
            result.problems.append(f"request {seq}: a reply is recorded but not its request")
            continue
        result.requests += 1
        if closed is None:
            result.problems.append(f"request {seq} ({received['task']}): still open; roll forward")
            continue
        charged = closed["ledger_entries"] - received["ledger_entries"]
        if charged < 0:
            result.problems.append(f"request {seq}: the ledger lost entries while answering it")
            continue
        explained += charged
        status = closed.get("status")
        if status == "released":
            result.released += 1
            if closed.get("private"):
                result.private_released += 1
                if charged == 0:
                    result.problems.append(
                        f"request {seq} ({received['task']}): a private reply left without a charge"
                    )
        elif status == "refused":
            result.refused += 1
        if status != "released" and charged > 0:
            result.unreleased_charges.append(seq)
    result.charges = ledger_entry_count(ledger)
    if result.charges != explained:
        result.problems.append(
            f"the ledger holds {result.charges} charge(s) but the journal explains {explained}: "
            "charges were made outside the journal"
        )
    return result


def iter_statuses(journal: SiteJournal) -> Iterator[tuple[str, str, str]]:
    """(task, status, detail) of every answered request, in order."""
    for record in journal.records():
        if record.get("event") == "answered":
            yield record.get("task", "?"), record.get("status", "?"), record.get("detail", "")
