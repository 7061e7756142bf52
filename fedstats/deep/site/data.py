"""A site's design as tensors: the agreed design, scaled by public bounds, without intercept.

The site builds the agreed design (:mod:`fedstats.site.handlers.design`, cached per
design), maps every column to ``[-1, 1]`` with the request's public
``(centre, half-width)`` scaling (:func:`fedstats.contract.design.feature_scaling`),
clips values outside, and drops the intercept column (a network has its own
biases). Binary designs give ``y``; survival designs give ``time`` and ``event``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedstats.contract.design import DesignSpec
from fedstats.deep.shared.wire import INTERCEPT, checked_spec
from fedstats.errors import MalformedRequestError
from fedstats.site.handlers.design import build_design, site_design
from fedstats.site.task import SiteContext


@dataclass(frozen=True)
class SiteTensors:
    """One site's rows as float32 tensors (they never leave the site)."""

    X: torch.Tensor
    y: torch.Tensor | None
    time: torch.Tensor | None
    event: torch.Tensor | None

    @property
    def n(self) -> int:
        return int(self.X.shape[0])


def checked_scaling(args: dict[str, Any], spec: DesignSpec) -> np.ndarray:
    """The request's ``(centre, half-width)`` per design column (public bounds)."""
    scaling = args.get("scaling")
    p = spec.n_params
    if not (
        isinstance(scaling, np.ndarray)
        and scaling.shape == (p, 2)
        and scaling.dtype.kind == "f"
        and np.isfinite(scaling).all()
        and (scaling[:, 1] > 0).all()
    ):
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=f"'scaling' must be a {p} x 2 array of (centre, positive half-width)",
        )
    return scaling.astype(np.float64)


def site_tensors(
    ctx: SiteContext, args: dict[str, Any], *, evaluation: bool = False
) -> SiteTensors:
    """The site's scaled design for the request's ``design`` and ``scaling``.

    For evaluation the design is built without the saturation rule (held-out
    sets may be small; the reply is a few sums whatever the design).
    """
    spec = checked_spec(args)
    scaling = checked_scaling(args, spec)
    design = build_design(ctx, spec, saturation=False) if evaluation else site_design(ctx, spec)
    scaled = np.clip((design.X - scaling[:, 0]) / scaling[:, 1], -1.0, 1.0)
    keep = [j for j, c in enumerate(spec.columns) if c != INTERCEPT]
    X = torch.from_numpy(np.ascontiguousarray(scaled[:, keep], dtype=np.float32))
    outcome = torch.from_numpy(design.y.astype(np.float32))
    if spec.outcome_kind == "survival":
        time = torch.from_numpy(np.asarray(design.time, dtype=np.float32))
        return SiteTensors(X=X, y=None, time=time, event=outcome)
    return SiteTensors(X=X, y=outcome, time=None, event=None)
