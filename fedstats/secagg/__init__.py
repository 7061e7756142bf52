"""Secure aggregation's shared parts: ring, Shamir shares, cryptography and the pinned roster.

The protocol's wire is in :mod:`fedstats.contract.secure_aggregation`, its site half in
:mod:`fedstats.site.secure_aggregation` and its coordinator half in
:mod:`fedstats.models.secure_aggregation`."""
