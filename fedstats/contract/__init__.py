"""The contract both sides of the wire share: what a site and the coordinator must agree on.

Pure functions and frozen records, no rows and no network, imported by the
site (:mod:`fedstats.site`) and the coordinator (:mod:`fedstats.models`)
alike, so that neither side carries its own copy of a rule the other checks:

* :mod:`fedstats.contract.codec` — the one codec of every message;
* :mod:`fedstats.contract.design` — the design spec, the formula's reading
  (:mod:`fedstats.contract.formula_grammar`, the allow-listed grammar) and the
  design columns both sides derive from it;
* :mod:`fedstats.contract.task_spec` and :mod:`fedstats.contract.tasks` — every
  task's name, request checks and reply schema, and the one reply schema both
  sides check (:func:`~fedstats.contract.task_spec.reply_schema`);
* :mod:`fedstats.contract.dp_request` — a request's ``dp`` block and a private
  reply's public facts;
* :mod:`fedstats.contract.refusals` — which error replies are refusals, and why;
* :mod:`fedstats.contract.secure_aggregation` — secure aggregation's task names,
  fields and masked vector, and :mod:`fedstats.contract.secagg_session` — a session's
  plan, graph and compact fields;
* :mod:`fedstats.contract.newton` — Newton's step and stopping rule;
* :mod:`fedstats.contract.paths` and :mod:`fedstats.contract.path_rules` — the path
  rules: the start and step of an iterative exact analysis, the statement a site
  signs over each answer, and how far a requested point may lie from the one a site
  re-derives (with :mod:`fedstats.contract.fairness` and
  :mod:`fedstats.contract.fine_gray`, the sums both sides compute a fair or a
  Fine–Gray step from).
"""
