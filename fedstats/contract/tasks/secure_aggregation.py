"""The secure-aggregation tasks as the wire names them (the protocol is in
:mod:`fedstats.contract.secure_aggregation`)."""

from __future__ import annotations

from fedstats.contract.secure_aggregation import (
    ADVERTISE_TASK,
    SHARE_TASK,
    UNMASK_TASK,
    advertise_schema,
    share_schema,
    unmask_schema,
)
from fedstats.contract.task_spec import TaskSpec

ADVERTISE = TaskSpec(
    name=ADVERTISE_TASK,
    schema=advertise_schema,
    description="secure aggregation: fresh public keys for one session",
    about_patients=False,
)
SHARE = TaskSpec(
    name=SHARE_TASK,
    schema=share_schema,
    description="secure aggregation: Shamir shares of the mask seed and key, sealed",
    about_patients=False,
)
UNMASK = TaskSpec(
    name=UNMASK_TASK,
    schema=unmask_schema,
    description="secure aggregation: the shares that remove the masks of one sum",
    about_patients=False,
)
