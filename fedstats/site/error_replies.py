"""The check every error reply passes before it leaves a site.

An error can carry what a result may not: "outcome 'y' has 1 value other than
0 and 1", "level 'x' on 1 row", "5 follow-up times are negative" each
describe a few patients. So an error reply passes the same rule as a result,
in this one place (:meth:`fedstats.site.silo.Silo.handle` calls it for every
error):

* a count below the site's small-cell threshold ``k_cell`` is withheld (the
  message then says "fewer than k"), and so is the level it counted;
* a site that requires privacy reports what is wrong with the *request*
  (malformed, refused, over budget, outside the protocol) but never what is in
  its data: every data error becomes one refusal that names no column
  value and no count, the details staying in the site's own log.

Free-text ``reason`` fields are written by the site's own code and never
quote data values or counts (tested in ``tests/security/test_error_replies.py``).
"""

from __future__ import annotations

from fedstats.errors import (
    DisclosureError,
    SiteDataError,
    SiteError,
)
from fedstats.site.disclosure import DisclosurePolicy

_COUNTED_VALUES = {"count": ("level",)}
"""Typed count fields, and the data values that are withheld with a small count."""


def checked_error(error: SiteError, policy: DisclosurePolicy) -> SiteError:
    """The error as it may leave the site (see the module docstring)."""
    if isinstance(error, SiteDataError) and policy.require_privacy:
        return DisclosureError(
            site=error.site,
            task=getattr(error, "task", None),
            reason=(
                "the site's data do not fit this request; a site that requires privacy does "
                "not describe its data in errors (its data engineer sees the details in the "
                "site's log)"
            ),
            rule="privacy-required",
        )
    values = error.values()
    changed = False
    for field, withheld in _COUNTED_VALUES.items():
        count = values.get(field)
        if isinstance(count, int | float) and not isinstance(count, bool) and count < policy.k_cell:
            values[field] = None
            for name in withheld:
                if name in values:
                    values[name] = None
            changed = True
    return type(error)(**values) if changed else error
