"""The one place where site tasks are registered.

A silo answers exactly these tasks; anything else is refused with
:class:`~fedstats.errors.UnknownTaskError`. Each entry names its handler and
the schema its reply must match (see :mod:`fedstats.schema`). Tasks of an
optional extra are named here and defined by the extra's own module, imported
the first time one of them is asked for.
"""

from __future__ import annotations

from fedstats.contract import secure_aggregation as secagg_wire
from fedstats.site import secure_aggregation as secagg_site
from fedstats.site.handlers import budget as budget_site
from fedstats.site.handlers import competing as competing_site
from fedstats.site.handlers import cox as cox_site
from fedstats.site.handlers import cox_private as cox_private_site
from fedstats.site.handlers import design as site_design
from fedstats.site.handlers import fairness as fairness_site
from fedstats.site.handlers import fine_gray as fine_gray_site
from fedstats.site.handlers import fingerprint as fingerprint_site
from fedstats.site.handlers import glm as glm_site
from fedstats.site.handlers import logistic as logistic_site
from fedstats.site.handlers import survival as survival_site
from fedstats.site.task import OptionalTasks, Task, TaskRegistry

DEEP_TASKS = OptionalTasks(
    names=("deep.train", "deep.evaluate"),
    module="fedstats.deep.site_tasks",
    extra="deep",
)
"""Local training and evaluation of deep models: served when ``fedstats[deep]`` (torch,
Opacus) is installed at the site; without it they are refused by name and the site
never imports torch."""

REGISTRY = TaskRegistry(
    [
        Task(
            name="describe",
            handler=site_design.describe,
            schema=site_design.describe_schema,
            description="kind of each variable and levels of categorical ones",
            about_patients=False,
        ),
        Task(
            name="prepare",
            handler=site_design.prepare,
            schema=site_design.prepare_schema,
            description="build the agreed design; patients, dropped rows and events",
            private_release=site_design.prepare_private_release,
        ),
        Task(
            name="logistic.summaries",
            handler=logistic_site.summaries,
            schema=logistic_site.summaries_schema,
            description="logistic score, information and log-likelihood at given coefficients",
            private_release=logistic_site.summaries_private_release,
        ),
        Task(
            name=glm_site.TASK,
            handler=glm_site.summaries,
            schema=glm_site.summaries_schema,
            description="GLM score, information, log-likelihood and fit sums of one family",
        ),
        Task(
            name="cox.summaries",
            handler=cox_site.summaries,
            schema=cox_site.summaries_schema,
            description="Cox log partial likelihood, score and information of the site's strata",
        ),
        Task(
            name=cox_site.GRID_TASK,
            handler=cox_site.grid_summaries,
            schema=cox_site.grid_summaries_schema,
            description="Cox risk-set and tied-event sums on a time grid (k-protected)",
        ),
        Task(
            name=cox_private_site.TASK,
            handler=cox_private_site.summaries,
            schema=cox_private_site.summaries_schema,
            description="private Cox: clipped per-patient score and information on a time grid",
            private_release=cox_private_site.summaries_private_release,
        ),
        Task(
            name=cox_site.CONCORDANCE_TASK,
            handler=cox_site.concordance,
            schema=cox_site.concordance_schema,
            description="Harrell's C pair counts among the site's patients at given coefficients",
        ),
        Task(
            name=cox_site.ROBUST_TASK,
            handler=cox_site.robust,
            schema=cox_site.robust_schema,
            description="Cox score residuals' cross-products summed over the site's clusters",
        ),
        Task(
            name=survival_site.TASK,
            handler=survival_site.counts,
            schema=survival_site.counts_schema,
            description="at-risk and event counts per group on a time grid (k-protected)",
            private_release=survival_site.counts_private_release,
            validate=survival_site.validate_private,
        ),
        Task(
            name=competing_site.TASK,
            handler=competing_site.counts,
            schema=competing_site.counts_schema,
            description="at-risk, cause and competing-cause counts per group on a time grid "
            "(k-protected)",
        ),
        Task(
            name=fine_gray_site.TASK,
            handler=fine_gray_site.summaries,
            schema=fine_gray_site.summaries_schema,
            description="Fine-Gray censoring-weighted risk-set sums and counts on a time grid "
            "(k-protected)",
        ),
        Task(
            name=fine_gray_site.ROBUST_TASK,
            handler=fine_gray_site.robust,
            schema=fine_gray_site.robust_schema,
            description="Fine-Gray score residuals' cross-products summed over the site's patients",
        ),
        Task(
            name=fairness_site.TASK,
            handler=fairness_site.summaries,
            schema=fairness_site.summaries_schema,
            description="per-group soft true-positive sums, their gradients, and AUC pair counts",
        ),
        Task(
            name="harmonize.fingerprint",
            handler=fingerprint_site.fingerprint,
            schema=fingerprint_site.fingerprint_schema,
            description="schema of the served frame: columns, kinds, levels, units, study digest",
            about_patients=False,
        ),
        Task(
            name="privacy.status",
            handler=budget_site.status,
            schema=budget_site.status_schema,
            description="the site's privacy budget for a study and whether a planned fit fits",
            about_patients=False,
        ),
        Task(
            name=secagg_wire.ADVERTISE_TASK,
            handler=secagg_site.advertise,
            schema=secagg_wire.advertise_schema,
            description="secure aggregation: fresh public keys for one session",
            about_patients=False,
        ),
        Task(
            name=secagg_wire.SHARE_TASK,
            handler=secagg_site.share,
            schema=secagg_wire.share_schema,
            description="secure aggregation: Shamir shares of the mask seed and key, sealed",
            about_patients=False,
        ),
        Task(
            name=secagg_wire.UNMASK_TASK,
            handler=secagg_site.unmask,
            schema=secagg_wire.unmask_schema,
            description="secure aggregation: the shares that remove the masks of one sum",
            about_patients=False,
        ),
    ],
    optional=[DEEP_TASKS],
)
