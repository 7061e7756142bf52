"""The silo: the only code that touches a site's rows.

A :class:`Silo` receives a request as bytes, routes it by task name to a
handler registered in :mod:`fedstats.tasks`, checks the reply with the site's
:class:`~fedstats.disclosure.DisclosurePolicy` and returns bytes. Every reply
leaves through :meth:`Silo.handle`, so the check happens in this one place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from fedstats import codec
from fedstats.disclosure import DisclosurePolicy, check_reply
from fedstats.errors import (
    CodecError,
    DisclosureError,
    InternalSiteError,
    MalformedRequestError,
    SiteError,
    StudyConfigurationError,
    UnknownTaskError,
    to_wire,
)
from fedstats.task import SiteContext, TaskRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SiteLogEntry:
    """The site's own record of one request it answered or refused."""

    task: str
    status: str  # "released", "refused" or "error"
    reply_bytes: int
    at: datetime
    detail: str = ""


class Silo:
    """One site's analysis frame behind the silo boundary.

    Parameters
    ----------
    name:
        The site's name, as the study knows it.
    frame:
        The harmonised analysis frame, one row per patient.
    policy:
        The site's disclosure control (defaults: threshold of 10 patients).
    registry:
        The tasks this silo answers; defaults to :data:`fedstats.tasks.REGISTRY`.
    """

    def __init__(
        self,
        name: str,
        frame: pd.DataFrame,
        *,
        policy: DisclosurePolicy | None = None,
        registry: TaskRegistry | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise StudyConfigurationError(f"a site needs a non-empty name, got {name!r}")
        if not isinstance(frame, pd.DataFrame):
            raise StudyConfigurationError(
                f"site {name!r}: the analysis frame must be a pandas DataFrame, "
                f"got {type(frame).__name__}"
            )
        if registry is None:
            from fedstats.tasks import REGISTRY

            registry = REGISTRY
        self.name = name
        self.policy = policy or DisclosurePolicy()
        self._registry = registry
        self._context = SiteContext(name=name, frame=frame, policy=self.policy)
        self.log: list[SiteLogEntry] = []

    def __repr__(self) -> str:
        return f"Silo({self.name!r}, {len(self._context.frame)} patients, {self.policy})"

    def handle(self, request: bytes) -> bytes:
        """Answer one request; the reply is always bytes, an error reply included."""
        task_name = "?"
        try:
            task_name, args = self._parse(request)
            task = self._registry.get(task_name)
            if task is None:
                raise UnknownTaskError(site=self.name, task=task_name)
            schema = task.schema(args)
            reply = task.handler(self._context, args)
            check_reply(
                self.policy,
                site=self.name,
                task=task_name,
                schema=schema,
                payload=reply.payload,
                contributors=reply.contributors,
            )
            out = codec.encode({"status": "ok", "result": reply.payload})
        except SiteError as error:
            error = error.located(self.name, task_name)
            status = "refused" if isinstance(error, DisclosureError) else "error"
            return self._record(
                task_name, status, {"status": "error", "error": to_wire(error)}, detail=str(error)
            )
        except Exception as error:
            log.exception("site %s: task %s failed", self.name, task_name)
            wire = to_wire(
                InternalSiteError(site=self.name, task=task_name, error_type=type(error).__name__)
            )
            return self._record(
                task_name, "error", {"status": "error", "error": wire}, detail=repr(error)
            )
        self.log.append(SiteLogEntry(task_name, "released", len(out), _now()))
        return out

    def _parse(self, request: bytes) -> tuple[str, dict[str, Any]]:
        try:
            message = codec.decode(request)
        except CodecError as error:
            raise MalformedRequestError(site=self.name, task="?", reason=str(error)) from None
        if not (isinstance(message, dict) and set(message) == {"task", "args"}):
            raise MalformedRequestError(
                site=self.name, task="?", reason="a request holds exactly 'task' and 'args'"
            )
        task, args = message["task"], message["args"]
        if not isinstance(task, str) or not isinstance(args, dict):
            raise MalformedRequestError(
                site=self.name,
                task=str(task)[:80],
                reason="'task' must be a string, 'args' a mapping",
            )
        return task, args

    def _record(self, task: str, status: str, message: dict, detail: str) -> bytes:
        out = codec.encode(message)
        self.log.append(SiteLogEntry(task, status, len(out), _now(), detail))
        return out


def _now() -> datetime:
    return datetime.now(UTC)
