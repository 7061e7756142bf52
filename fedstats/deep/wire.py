"""The deep-model tasks as the wire names them: ``deep.train`` and ``deep.evaluate``.

:data:`TASK_SPECS` are the specs :data:`fedstats.contract.tasks.DEEP_SPECS` names,
imported by the coordinator the first time a deep task is asked for (the ``deep``
extra: the schemas count a network's parameters with torch).
"""

from __future__ import annotations

from fedstats.contract.task_spec import TaskSpec
from fedstats.deep.site_tasks import EVALUATE_TASK, TRAIN_TASK, evaluate_schema, train_schema

TASK_SPECS = [
    TaskSpec(
        name=TRAIN_TASK,
        schema=train_schema,
        description="one round of local training of a registered network; the flat update",
        private=True,
    ),
    TaskSpec(
        name=EVALUATE_TASK,
        schema=evaluate_schema,
        description="a network's performance on the site's rows as sums and counts",
    ),
]
"""The deep-model tasks' specs, in the order the site registers them."""
