"""The protocol a site approved: the analyses it answers exactly (stub; being written)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Protocol:
    """An approved protocol; :meth:`admit` refuses requests outside it."""

    digest: str = ""

    def admit(self, site: str, task: str, args: dict[str, Any], *, private: bool) -> None:
        """Raise :class:`~fedstats.errors.ProtocolError` for a request outside the protocol."""


def load_protocol(path: Path) -> Protocol:
    """Read and validate a protocol file (stub)."""
    raise NotImplementedError
