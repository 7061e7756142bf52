"""Flower messages and the coordinator's wait for one reply (:meth:`GridLink._wait`), with a grid
that answers as Flower's SuperLink does when a site's reply objects are still uploading: a
``MESSAGE_UNAVAILABLE`` error, then the reply."""

from __future__ import annotations

from types import SimpleNamespace

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
    """``m2``'s reply is there only at the first pull (then Flower loses it, as when another
    node of the round is removed); ``m1``'s arrives at the third."""

    def __init__(self) -> None:
        self.pulls = 0

    def pull_messages(self, message_ids):
        self.pulls += 1
        out = []
        if "m2" in message_ids and self.pulls == 1:
            out.append(Pulled("m2", None))
        if "m1" in message_ids and self.pulls >= 3:
            out.append(Pulled("m1", None))
        return out


def test_the_rounds_other_replies_are_kept_while_one_is_awaited():
    """Waiting for a slow site, the coordinator pulls the round's other replies as they come
    and keeps them: a reply Flower would lose later is not a lost site."""
    policy = PolicySection(discovery_timeout=1.0, poll_interval=0.001, identify_grace=0.0)
    link = GridLink(VanishingGrid(), policy)
    link._in_flight[("s2", "d")] = "m2"  # the round's request to the other site, not yet read
    assert link._wait("m1", 1.0) is not None
    del link._in_flight[("s2", "d")]  # read now, as send() does
    reply = link._wait("m2", 0.05)
    assert reply is not None and not reply.has_error()
