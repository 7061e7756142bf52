"""The secure-aggregation tasks as the wire names them (the protocol is in
:mod:`fedstats.contract.secure_aggregation` and :mod:`fedstats.contract.secagg_session`)."""

from __future__ import annotations

from fedstats.contract.secagg_session import (
    advertise_schema,
    confirm_schema,
    share_schema,
    unmask_schema,
)
from fedstats.contract.secure_aggregation import (
    ADVERTISE_TASK,
    CONFIRM_TASK,
    SHARE_TASK,
    UNMASK_TASK,
)
from fedstats.contract.task_spec import TaskSpec

ADVERTISE = TaskSpec(
    name=ADVERTISE_TASK,
    schema=advertise_schema,
    description="secure aggregation: fresh public keys for one session, signed",
    about_patients=False,
)
SHARE = TaskSpec(
    name=SHARE_TASK,
    schema=share_schema,
    description="secure aggregation: Shamir shares of the mask seed and key, sealed for each "
    "graph neighbour",
    about_patients=False,
)
CONFIRM = TaskSpec(
    name=CONFIRM_TASK,
    schema=confirm_schema,
    description="secure aggregation: the survivor set, signed once (consistency check)",
    about_patients=False,
)
UNMASK = TaskSpec(
    name=UNMASK_TASK,
    schema=unmask_schema,
    description="secure aggregation: the shares that remove the masks of one sum",
    about_patients=False,
)
