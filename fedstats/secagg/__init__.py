"""Secure aggregation's shared parts: ring, Shamir shares, cryptography, the pinned roster and
SecAgg+'s graph (:mod:`fedstats.secagg.graph`).

The protocol's wire is in :mod:`fedstats.contract.secure_aggregation`, its site half in
:mod:`fedstats.site.secure_aggregation` (with :mod:`fedstats.site.secure_unmasking`) and its
coordinator half in :mod:`fedstats.models.secure_aggregation`."""
