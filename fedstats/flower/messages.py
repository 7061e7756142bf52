"""Flower messages that carry fedstats' codec bytes unchanged.

A request is a Flower ``Message`` of type ``query.fedstats`` whose content
holds one :class:`flwr.app.ConfigRecord` with one ``bytes`` value: exactly
the bytes :func:`fedstats.contract.codec.encode` made. The reply carries the silo's
reply bytes the same way. Nothing else about the study travels in a message:
a site's frame, disclosure policy and ledger come from the site's own
configuration. ``query.identify`` asks a node which site it serves.

Each message's record also holds 16 random bytes (``nonce``). Flower stores a message's
records as content-addressed objects, and two messages with identical content in quick
succession (the same request broadcast to every site, a site's identical identify replies)
shared one object, which one message's clean-up could remove while the other still pushed
it (``ObjectPushError: ... was not pre-registered``): with the nonce no two messages share
an object.
"""

from __future__ import annotations

import secrets

from flwr.app import ConfigRecord, Message, RecordDict

from fedstats.errors import MessageFormatError

TASK_ACTION = "fedstats"
IDENTIFY_ACTION = "identify"
TASK_MESSAGE_TYPE = f"query.{TASK_ACTION}"
IDENTIFY_MESSAGE_TYPE = f"query.{IDENTIFY_ACTION}"
RECORD = "fedstats"
PAYLOAD = "payload"
SITE = "site"
NONCE = "nonce"


def pack(payload: bytes) -> RecordDict:
    """Content of a message carrying ``payload`` (codec bytes) unchanged."""
    if not isinstance(payload, bytes):
        raise MessageFormatError(f"a payload must be bytes, got {type(payload).__name__}")
    return RecordDict({RECORD: ConfigRecord({PAYLOAD: payload, NONCE: secrets.token_bytes(16)})})


def unpack(message: Message) -> bytes:
    """The codec bytes a message carries; :class:`MessageFormatError` if it carries none."""
    if message.has_error():
        error = message.error
        raise MessageFormatError(f"the message is an error reply: {error.code} {error.reason}")
    record = message.content.config_records.get(RECORD)
    payload = None if record is None else record.get(PAYLOAD)
    if not isinstance(payload, bytes):
        raise MessageFormatError(f"the message has no bytes in record {RECORD!r}/{PAYLOAD!r}")
    return payload


def identity(site: str) -> RecordDict:
    """Content of an ``identify`` reply: the site's name as its own configuration gives it."""
    return RecordDict({RECORD: ConfigRecord({SITE: site, NONCE: secrets.token_bytes(16)})})


def site_of(message: Message) -> str:
    """The site name an ``identify`` reply carries."""
    if message.has_error():
        raise MessageFormatError(f"identify failed: {message.error.reason}")
    record = message.content.config_records.get(RECORD)
    site = None if record is None else record.get(SITE)
    if not isinstance(site, str) or not site:
        raise MessageFormatError("an identify reply must carry the site's name")
    return site
