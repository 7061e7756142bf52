"""Every task of the study's wire: its name, request checks and reply schema, one module a family.

:data:`TASKS` is the catalogue the coordinator checks replies against
(:class:`fedstats.models.federation.Federation`); a site binds each spec to
its handler (:mod:`fedstats.site.registry`). The deep-model tasks belong to
the ``deep`` extra and are specified by :mod:`fedstats.deep.shared.wire`, imported the
first time one of them is asked for.
"""

from __future__ import annotations

from fedstats.contract.task_spec import OptionalSpecs, TaskCatalogue
from fedstats.contract.tasks import (
    budget,
    classifier_scores,
    competing,
    cox,
    cox_private,
    design,
    fairness,
    fine_gray,
    fingerprint,
    glm,
    logistic,
    record_linkage,
    secure_aggregation,
    survival,
    vertical,
)

DEEP_SPECS = OptionalSpecs(
    names=("deep.train", "deep.evaluate"),
    module="fedstats.deep.shared.wire",
    extra="deep",
)
"""Local training and evaluation of deep models: specified by the ``deep`` extra."""

TASKS = TaskCatalogue(
    [
        design.DESCRIBE,
        design.PREPARE,
        logistic.SUMMARIES,
        classifier_scores.EVALUATE,
        glm.SUMMARIES,
        cox.SUMMARIES,
        cox.GRID_SUMMARIES,
        cox_private.SUMMARIES,
        cox.CONCORDANCE,
        cox.ROBUST,
        survival.COUNTS,
        competing.COUNTS,
        fine_gray.SUMMARIES,
        fine_gray.ROBUST,
        fairness.SUMMARIES,
        fingerprint.FINGERPRINT,
        budget.STATUS,
        secure_aggregation.ADVERTISE,
        secure_aggregation.SHARE,
        secure_aggregation.CONFIRM,
        secure_aggregation.UNMASK,
        *vertical.SPECS,
        *record_linkage.SPECS,
    ],
    optional=[DEEP_SPECS],
)
"""The tasks of the study's wire, in the order the site registers them."""
