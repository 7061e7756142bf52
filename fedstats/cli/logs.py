"""Where the command line's progress, events and errors go: standard ``logging`` on stderr.

Jobs report progress as ``logging`` records carrying an ``event`` name and
``fields`` (:func:`fedstats.jobs.events.emit`); this module gives them one
handler on stderr, in one of two forms chosen by the global options:

* plain (default): one readable line per event, ``fedstats: <message>``;
* ``--json-log``: one JSON object per line (``time``, ``level``, ``event``,
  ``message``, ``fields``), for cron, systemd's journal and log shippers
  (the JSON Lines format, https://jsonlines.org). Python warnings and
  command errors become such lines too, so every stderr line parses.

``--quiet`` drops progress (INFO) but keeps warnings and errors. Results
stay on stdout either way.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

import click
import typer

LOGGERS = ("fedstats", "py.warnings")
"""The loggers whose records reach the command line's handler."""

_HANDLER_NAME = "fedstats-cli"


class JsonLineFormatter(logging.Formatter):
    """A log record as one JSON object: time (UTC, ISO 8601), level, event, message, fields."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", None) or _default_event(record),
            "message": record.getMessage(),
            "fields": getattr(record, "fields", None) or {},
        }
        return json.dumps(document, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """A log record as ``fedstats: <message>`` (``warning:`` for warnings)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {message}"
        return f"fedstats: {message}"


def _default_event(record: logging.LogRecord) -> str:
    return "warning" if record.name == "py.warnings" else record.name


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record arrives (as logging's own
    last-resort handler does), so a handler left from an earlier command never writes
    to a stream that command has since closed."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # the handler always follows sys.stderr
        pass


_JSON_LOG = "fedstats.json_log"
"""Key in the root click context's ``meta``: whether this invocation logs JSON lines."""


def _json_log_requested() -> bool:
    """``--json-log`` was given to the command now running (False outside a command, or
    when a command group was invoked without the root callback): read from the
    invocation's own context, so one command's choice never leaks into the next."""
    context = click.get_current_context(silent=True)
    return bool(context is not None and context.find_root().meta.get(_JSON_LOG, False))


def plain_progress_on_terminal() -> bool:
    """Progress is shown (not ``--quiet``), as plain text (not ``--json-log``), to a terminal."""
    shown = logging.getLogger("fedstats").isEnabledFor(logging.INFO)
    return shown and not _json_log_requested() and sys.stderr.isatty()


def configure(*, quiet: bool, json_log: bool) -> None:
    """Send the jobs' records to the current stderr, as plain lines or JSON lines.

    Called once per command. Inside a command the handler lives as long as
    the command's invocation: when it ends, the loggers get back the handlers,
    levels and propagation they had, so one invocation's choices never reach
    the next (a program or test that runs several commands in one process).
    """
    context = click.get_current_context(silent=True)
    if context is not None:
        context.find_root().meta[_JSON_LOG] = json_log
    handler = _CurrentStderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonLineFormatter() if json_log else PlainFormatter())
    saved = {
        name: (logging.getLogger(name).level, logging.getLogger(name).propagate) for name in LOGGERS
    }
    logging.captureWarnings(json_log)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        _detach(logger)
        if name == "py.warnings" and not json_log:
            continue
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING if quiet else logging.INFO)
        logger.propagate = False

    def restore() -> None:
        logging.captureWarnings(False)
        for name, (level, propagate) in saved.items():
            logger = logging.getLogger(name)
            _detach(logger)
            logger.setLevel(level)
            logger.propagate = propagate

    if context is not None:
        context.find_root().call_on_close(restore)


def _detach(logger: logging.Logger) -> None:
    """Remove the command line's handler from ``logger`` (any earlier call's)."""
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)


def fail(message: str, code: int) -> None:
    """Report a command's failure on stderr (plain text, or one JSON line) and exit with ``code``.

    Plain text, never terminal colour codes: the message reaches cron mail
    and journals as it is.
    """
    if _json_log_requested():
        logging.getLogger("fedstats.cli").error(
            message, extra={"event": "failed", "fields": {"exit_code": int(code)}}
        )
    else:
        lines = message.splitlines() or [""]
        typer.echo(f"error: {lines[0]}", err=True)
        for line in lines[1:]:
            typer.echo(line, err=True)
    raise typer.Exit(code=int(code))
