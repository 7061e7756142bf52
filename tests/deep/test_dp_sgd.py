"""DP-SGD at a site: the clipping engines agree with Opacus' per-sample gradients."""

from __future__ import annotations

import pytest
import torch

from fedstats.deep import build_model
from fedstats.deep.shared.dp_sgd_plan import DpSgdPlan
from fedstats.deep.site.dp_sgd import PrivateGradient


def _gradient(engine: str, sigma: float, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = build_model("mlp", 6, {"hidden": [8, 5]})
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(1)) * 3
    y = (torch.rand(40, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = DpSgdPlan(0.4, sigma, 0.5, 1, engine)
    private = PrivateGradient(model, optimizer, plan, 100, torch.Generator().manual_seed(seed))
    private.noisy_gradient(x, y)
    grads = [p.grad.detach().clone() for p in model.parameters()]
    assert private.steps_taken == 1
    private.close()
    return grads


@pytest.mark.parametrize("engine", ["bookkeeping", "ghost"])
def test_clipped_mean_gradient_equals_opacus_per_sample_clipping(engine):
    """Oracle: Opacus' default engine, which materialises every per-sample gradient
    (``GradSampleModule`` + ``DPOptimizer``), without noise: ``sum_i clip(g_i) / (q n)``."""
    reference = _gradient("hooks", 0.0, 0)
    for got, want in zip(_gradient(engine, 0.0, 0), reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_noise_has_the_declared_scale():
    """With sigma = 50 the noise dominates: its sd per coordinate is sigma C / (q n)."""
    noisy = torch.cat([g.ravel() for g in _gradient("bookkeeping", 50.0, 3)])
    clean = torch.cat([g.ravel() for g in _gradient("bookkeeping", 0.0, 3)])
    sd = float((noisy - clean).std())
    assert sd == pytest.approx(50.0 * 0.5 / 40.0, rel=0.15)


def test_poisson_batches_have_the_distribution_of_opacus_sampler():
    """Oracle: Opacus' ``UniformWithReplacementSampler`` (one Bernoulli(q) per row): batch sizes
    Binomial(n, q) (mean n q, variance n q (1 - q)); every row included with probability q."""
    import numpy as np
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    from fedstats.deep.site.dp_sgd import poisson_batches

    n, q, steps = 200, 0.1, 4000
    plan = DpSgdPlan(q, 1.0, 1.0, steps)
    ours = list(poisson_batches(n, plan, torch.Generator().manual_seed(0)))
    theirs = list(
        UniformWithReplacementSampler(
            num_samples=n, sample_rate=q, steps=steps, generator=torch.Generator().manual_seed(0)
        )
    )
    for batches in (ours, theirs):
        sizes = np.array([len(b) for b in batches])
        assert sizes.mean() == pytest.approx(n * q, rel=0.02)
        assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.1)
        counts = np.bincount(np.concatenate([np.asarray(b) for b in batches]), minlength=n)
        assert counts.max() <= steps * q + 5 * np.sqrt(steps * q)
        assert all(len(set(np.asarray(b).tolist())) == len(b) for b in batches[:50])
