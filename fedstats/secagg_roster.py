"""The secure-aggregation roster a site pins (stub; being written)."""

from __future__ import annotations

from typing import Any


class RosterPin:
    """The participants, their signing keys and this site's own signing key."""


def load_roster_pin(section: Any, *, site: str) -> RosterPin:
    """The pin described by a site's ``[secure_aggregation]`` section (stub)."""
    raise NotImplementedError
