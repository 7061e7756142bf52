"""Flower messages and the coordinator's wait for one reply (:meth:`GridLink._wait`), with grids
that answer as Flower's SuperLink does when a site's reply objects are still uploading (a
``MESSAGE_UNAVAILABLE`` error, then the reply), when a reply is consumed by its first pull, and
when a pull hangs on a dead site's half-uploaded reply."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from flwr.common.constant import ErrorCode

from fedstats.flower_apps.grid_transport import GridLink
from fedstats.jobs.study_config import PolicySection


class Pulled:
    def __init__(self, message_id: str, code: int | None) -> None:
        self.metadata = SimpleNamespace(reply_to_message_id=message_id)
        self.error = None if code is None else SimpleNamespace(code=code, reason="")

    def has_error(self) -> bool:
        return self.error is not None


class UploadingGrid:
    """Each pull of ``m1`` gives ``codes[i]`` in turn (``None``: the reply itself)."""

    def __init__(self, codes: list[int | None]) -> None:
        self.codes = list(codes)

    def pull_messages(self, message_ids):
        if not self.codes:
            return []
        return [Pulled(message_ids[0], self.codes.pop(0))]


def waited(codes: list[int | None], timeout: float = 1.0):
    policy = PolicySection(discovery_timeout=1.0, poll_interval=0.001, identify_grace=0.0)
    return GridLink(UploadingGrid(codes), policy)._wait("m1", timeout)


def test_a_reply_still_uploading_is_pulled_again_until_it_arrives():
    """Two ``MESSAGE_UNAVAILABLE`` pulls, then the reply: the reply, not a lost site."""
    reply = waited([ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE, None])
    assert reply is not None and not reply.has_error()


def test_a_reply_that_never_finishes_uploading_is_its_error_at_the_deadline():
    reply = waited([ErrorCode.MESSAGE_UNAVAILABLE] * 10_000, timeout=0.05)
    assert reply is not None and reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE


def test_other_flower_errors_are_returned_at_once():
    """A node Flower reports unavailable (no heartbeat) is not waited for."""
    reply = waited([ErrorCode.NODE_UNAVAILABLE, None])
    assert reply is not None and reply.error.code == ErrorCode.NODE_UNAVAILABLE


def test_two_messages_with_the_same_payload_share_no_flower_object():
    """Flower stores records as content-addressed objects; identical content in quick
    succession (one request broadcast to every site, a site's repeated identify replies)
    once shared an object one message's clean-up removed under the other. Each message now
    carries 16 random bytes, and the payload comes back unchanged."""
    from fedstats.flower import messages

    first, second = messages.pack(b"same"), messages.pack(b"same")
    assert first.object_id != second.object_id
    assert messages.identity("s").object_id != messages.identity("s").object_id
    assert first[messages.RECORD][messages.PAYLOAD] == b"same"


class VanishingGrid:
    """``m2``'s reply is there only at its first pull (then Flower has consumed it: a reply
    is deleted at the SuperLink when it is pulled); ``m1``'s arrives at its third pull."""

    def __init__(self) -> None:
        self.pulls = {"m1": 0, "m2": 0}

    def pull_messages(self, message_ids):
        (message_id,) = message_ids  # one message per call (fedstats.flower_apps.reply_pulls)
        self.pulls[message_id] += 1
        if message_id == "m2" and self.pulls["m2"] == 1:
            return [Pulled("m2", None)]
        if message_id == "m1" and self.pulls["m1"] >= 3:
            return [Pulled("m1", None)]
        return []


def in_flight(link: GridLink, *message_ids: str) -> None:
    """The round's requests to other sites, pushed and not yet read (as prefetch leaves them)."""
    for number, message_id in enumerate(message_ids):
        link._in_flight[(f"s{number}", "d")] = message_id


def test_the_rounds_other_replies_are_kept_while_one_is_awaited():
    """Waiting for a slow site, the coordinator pulls the round's other replies as they come
    and keeps them: a reply Flower will not give twice is not a lost site."""
    policy = PolicySection(discovery_timeout=1.0, poll_interval=0.001, identify_grace=0.0)
    link = GridLink(VanishingGrid(), policy)
    in_flight(link, "m2")
    assert link._wait("m1", 1.0) is not None
    link._in_flight.clear()  # m2 read now, as send() does
    reply = link._wait("m2", 0.05)
    assert reply is not None and not reply.has_error()


class DeadUploaderGrid:
    """``m2``'s sender died mid-upload: Flower's pull of it consumes the reply, then retries
    its missing objects for minutes (here until the test releases it) and ends with
    ``MESSAGE_UNAVAILABLE``. ``m1``'s reply, from a live site, is there at once."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def pull_messages(self, message_ids):
        (message_id,) = message_ids
        if message_id == "m2":
            self.release.wait(30.0)
            return [Pulled("m2", ErrorCode.MESSAGE_UNAVAILABLE)]
        return [Pulled(message_id, None)]


def test_a_pull_flower_cannot_finish_holds_neither_another_reply_nor_the_deadline():
    """One Flower pull of a dead site's half-uploaded reply lasted three minutes, and a live
    site whose reply came back from the same call was counted lost at its round timeout. Each
    message is now pulled by its own background call: the live site's reply is read at once
    while the dead site's pull hangs, and the dead site is lost at its own deadline."""
    policy = PolicySection(discovery_timeout=1.0, poll_interval=0.001, identify_grace=0.0)
    grid = DeadUploaderGrid()
    link = GridLink(grid, policy)
    try:
        in_flight(link, "m2")
        started = time.monotonic()
        reply = link._wait("m1", 5.0)
        assert reply is not None and not reply.has_error()
        link._in_flight.clear()
        assert link._wait("m2", 0.3) is None
        assert time.monotonic() - started < 3.0
    finally:
        grid.release.set()
    deadline = time.monotonic() + 5.0
    while link.pulls.running("m2") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert link.pulls.take("m2") is None  # given up: its late outcome is not kept


class FailingGrid:
    def pull_messages(self, message_ids):
        raise ConnectionError("SuperLink gone")


def test_a_failed_pull_is_raised_to_the_waiter():
    policy = PolicySection(discovery_timeout=1.0, poll_interval=0.001, identify_grace=0.0)
    with pytest.raises(ConnectionError, match="SuperLink gone"):
        GridLink(FailingGrid(), policy)._wait("m1", 1.0)
