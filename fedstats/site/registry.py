"""The one place where site tasks are registered.

A silo answers exactly these tasks; anything else is refused with
:class:`~fedstats.errors.UnknownTaskError`. Each entry binds a handler to a
task of the contract (:mod:`fedstats.contract.tasks`: its name and the schema
its reply must match, see :mod:`fedstats.schema`), and adds the site's private
form of the task when it has one. Tasks of an optional extra are named here and
defined by the extra's own module, imported the first time one of them is
asked for.
"""

from __future__ import annotations

from fedstats.contract.tasks import budget as budget_wire
from fedstats.contract.tasks import classifier_scores as classifier_wire
from fedstats.contract.tasks import competing as competing_wire
from fedstats.contract.tasks import cox as cox_wire
from fedstats.contract.tasks import cox_private as cox_private_wire
from fedstats.contract.tasks import design as design_wire
from fedstats.contract.tasks import fairness as fairness_wire
from fedstats.contract.tasks import fine_gray as fine_gray_wire
from fedstats.contract.tasks import fingerprint as fingerprint_wire
from fedstats.contract.tasks import glm as glm_wire
from fedstats.contract.tasks import logistic as logistic_wire
from fedstats.contract.tasks import record_linkage as linkage_wire
from fedstats.contract.tasks import secure_aggregation as secagg_wire
from fedstats.contract.tasks import survival as survival_wire
from fedstats.contract.tasks import vertical as vertical_wire
from fedstats.site import secure_aggregation as secagg_site
from fedstats.site import secure_unmasking as secagg_unmasking
from fedstats.site.handlers import budget as budget_site
from fedstats.site.handlers import classifier_scores as classifier_site
from fedstats.site.handlers import competing as competing_site
from fedstats.site.handlers import cox as cox_site
from fedstats.site.handlers import cox_private as cox_private_site
from fedstats.site.handlers import design as site_design
from fedstats.site.handlers import fairness as fairness_site
from fedstats.site.handlers import fine_gray as fine_gray_site
from fedstats.site.handlers import fingerprint as fingerprint_site
from fedstats.site.handlers import glm as glm_site
from fedstats.site.handlers import logistic as logistic_site
from fedstats.site.handlers import record_linkage as linkage_site
from fedstats.site.handlers import survival as survival_site
from fedstats.site.handlers import vertical as vertical_site
from fedstats.site.task import OptionalTasks, Task, TaskRegistry

DEEP_TASKS = OptionalTasks(
    names=("deep.train", "deep.evaluate"),
    module="fedstats.deep.site.tasks",
    extra="deep",
)
"""Local training and evaluation of deep models: served when ``fedstats[deep]`` (torch,
Opacus) is installed at the site; without it they are refused by name and the site
never imports torch."""

REGISTRY = TaskRegistry(
    [
        Task.serving(design_wire.DESCRIBE, site_design.describe),
        Task.serving(
            design_wire.PREPARE,
            site_design.prepare,
            private_release=site_design.prepare_private_release,
        ),
        Task.serving(
            logistic_wire.SUMMARIES,
            logistic_site.summaries,
            private_release=logistic_site.summaries_private_release,
        ),
        Task.serving(classifier_wire.EVALUATE, classifier_site.evaluate),
        Task.serving(glm_wire.SUMMARIES, glm_site.summaries),
        Task.serving(cox_wire.SUMMARIES, cox_site.summaries),
        Task.serving(cox_wire.GRID_SUMMARIES, cox_site.grid_summaries),
        Task.serving(
            cox_private_wire.SUMMARIES,
            cox_private_site.summaries,
            private_release=cox_private_site.summaries_private_release,
        ),
        Task.serving(cox_wire.CONCORDANCE, cox_site.concordance),
        Task.serving(cox_wire.ROBUST, cox_site.robust),
        Task.serving(
            survival_wire.COUNTS,
            survival_site.counts,
            private_release=survival_site.counts_private_release,
            validate=survival_site.validate_private,
        ),
        Task.serving(competing_wire.COUNTS, competing_site.counts),
        Task.serving(fine_gray_wire.SUMMARIES, fine_gray_site.summaries),
        Task.serving(fine_gray_wire.ROBUST, fine_gray_site.robust),
        Task.serving(fairness_wire.SUMMARIES, fairness_site.summaries),
        Task.serving(fingerprint_wire.FINGERPRINT, fingerprint_site.fingerprint),
        Task.serving(budget_wire.STATUS, budget_site.status),
        Task.serving(secagg_wire.ADVERTISE, secagg_site.advertise),
        Task.serving(secagg_wire.SHARE, secagg_site.share),
        Task.serving(secagg_wire.CONFIRM, secagg_unmasking.confirm),
        Task.serving(secagg_wire.UNMASK, secagg_unmasking.unmask),
        Task.serving(vertical_wire.PREPARE_SPEC, vertical_site.prepare),
        Task.serving(vertical_wire.ENCRYPT_SPEC, vertical_site.encrypt_outcome),
        Task.serving(vertical_wire.MASKED_SPEC, vertical_site.masked_products),
        Task.serving(vertical_wire.DECRYPT_SPEC, vertical_site.decrypt),
        Task.serving(vertical_wire.UNMASK_SPEC, vertical_site.unmask),
        Task.serving(vertical_wire.SUMMARIES, vertical_site.summaries),
        Task.serving(linkage_wire.ADVERTISE_SPEC, linkage_site.advertise),
        Task.serving(linkage_wire.ENCODE_SPEC, linkage_site.encode),
        Task.serving(linkage_wire.ACCEPT_SPEC, linkage_site.accept),
    ],
    optional=[DEEP_TASKS],
)
