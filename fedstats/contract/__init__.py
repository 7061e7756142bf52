"""The contract both sides of the wire share: what a site and the coordinator must agree on.

Pure functions and frozen records, no rows and no network, imported by the
site (:mod:`fedstats.site`) and the coordinator (:mod:`fedstats.models`)
alike, so that neither side carries its own copy of a rule the other checks:

* :mod:`fedstats.contract.codec` — the one codec of every message;
* :mod:`fedstats.contract.newton` — Newton's step and stopping rule;
* :mod:`fedstats.contract.paths` — the path rules: the start and step of an
  iterative exact analysis, the statement a site signs over each answer, and
  how far a requested point may lie from the one a site re-derives.
"""
