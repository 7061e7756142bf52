"""Record-level DP-SGD at a site: Poisson sampling, per-patient clipping, Gaussian noise.

DP-SGD (Abadi et al., CCS 2016): each of ``T`` steps draws a batch by
Poisson sampling — every patient independently with probability ``q``
(:func:`poisson_batches`; this is the sampling the accountant assumes, not
shuffling into fixed batches) — clips each
patient's gradient to norm ``C``, sums, adds ``N(0, sigma^2 C^2)`` to every
coordinate and divides by the expected batch size ``q n``. Its privacy is
the event ``SelfComposedDpEvent(PoissonSampledDpEvent(q,
GaussianDpEvent(sigma)), T)``, accounted by RDP (Mironov, CSF 2017;
Mironov, Talwar & Zhang 2019 for the sampled Gaussian). The silo charges
exactly this event before training (``Task.private_training``); the site
checks afterwards that Opacus' accountant counted the same number of steps.

Engines (all compute the same clipped sum; Opacus' optimizer adds the noise,
scales and counts the steps):

* ``"bookkeeping"`` — for models whose parameters all sit in ``nn.Linear``
  layers fed ``(batch, features)`` inputs: one backward pass to the layers'
  outputs ``g_i``; patient ``i``'s gradient norm is
  ``sqrt(sum_layers |g_i|^2 (|a_i|^2 + 1))`` (``a_i`` the layer input, ``+1``
  for the bias) and the clipped sum of weight gradients is ``(c * G)^T A``
  with ``c_i = min(1, C / norm_i)``: ghost norms (Goodfellow 2015; Li et al.,
  ICLR 2022) with book-keeping (Bu et al., ICML 2023), so no per-patient
  gradient is materialised and there is no second backward pass.
* ``"ghost"`` — Opacus' ghost clipping (``GradSampleModuleFastGradientClipping``
  with ``DPLossFastGradientClipping``): two backward passes, any layer Opacus knows.
* ``"hooks"`` — Opacus' default: per-patient gradients materialised by hooks.
* ``"auto"`` — book-keeping when the model allows it, else ghost clipping.
"""

from __future__ import annotations

import secrets
import warnings

import numpy as np
import torch
from opacus import GradSampleModule
from opacus.accountants import RDPAccountant
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from torch import nn

from fedstats.deep.shared.dp_sgd_plan import DpSgdPlan
from fedstats.deep.shared.losses import binary_loss
from fedstats.errors import MalformedRequestError


def generators(seed: int | None) -> tuple[torch.Generator, torch.Generator]:
    """Generators of the Poisson sampling and the noise: OS entropy unless ``seed`` is fixed."""
    first = secrets.randbits(63) if seed is None else int(seed) % (2**63)
    second = secrets.randbits(63) if seed is None else (first + 1) % (2**63)
    return torch.Generator().manual_seed(first), torch.Generator().manual_seed(second)


def poisson_batches(n: int, plan: DpSgdPlan, generator: torch.Generator):
    """``plan.steps`` Poisson-sampled batches: every row in each batch with probability ``q``.

    Drawn as a ``Binomial(n, q)`` batch size, then that many distinct rows
    uniformly at random: the same distribution as ``n`` independent
    ``Bernoulli(q)`` draws (given its size, a Poisson sample is a uniform
    subset), which Opacus' ``UniformWithReplacementSampler`` draws one row at
    a time. Rows are picked by Floyd's algorithm (numpy's ``choice`` without
    replacement), in ``O(batch)`` rather than ``O(n)`` per step.
    """
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    rng = np.random.default_rng(seed)
    for _ in range(plan.steps):
        size = int(rng.binomial(n, plan.sample_rate))
        yield rng.choice(n, size=size, replace=False, shuffle=False)


def bookkeeping_possible(model: nn.Module) -> bool:
    """Whether every parameter belongs to an ``nn.Linear`` layer (book-keeping applies)."""
    linear = {id(p) for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters()}
    return all(id(p) in linear for p in model.parameters())


class PrivateGradient:
    """Puts DP-SGD's noisy mean gradient of a batch into every ``p.grad``.

    ``optimizer`` is the local optimizer; Opacus' DP optimizer wraps it to
    add noise ``N(0, sigma^2 C^2)``, divide by ``q n`` and count the step in
    an Opacus ``RDPAccountant`` (kept as :attr:`accountant`). The caller then
    applies any correction that does not read data (FedProx, SCAFFOLD) and
    calls :meth:`apply`.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        plan: DpSgdPlan,
        n: int,
        noise: torch.Generator,
    ) -> None:
        engine = plan.engine
        if engine == "auto":
            engine = "bookkeeping" if bookkeeping_possible(model) else "ghost"
        if engine == "bookkeeping" and not bookkeeping_possible(model):
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="book-keeping clipping needs a model whose parameters are all in "
                "nn.Linear layers; ask for engine 'ghost' or 'hooks'",
            )
        self.engine = engine
        self.model = model
        expected = plan.sample_rate * n
        common = {
            "noise_multiplier": plan.noise_multiplier,
            "max_grad_norm": plan.max_grad_norm,
            "expected_batch_size": expected,
            "loss_reduction": "mean",
            "generator": noise,
        }
        self._clip = plan.max_grad_norm
        if engine == "hooks":
            self.module: nn.Module = GradSampleModule(model)
            self.optimizer = DPOptimizer(optimizer, **common)
        elif engine == "ghost":
            self.module = GradSampleModuleFastGradientClipping(
                model, max_grad_norm=plan.max_grad_norm, use_ghost_clipping=True
            )
            self.optimizer = DPOptimizerFastGradientClipping(optimizer, **common)
            self._criterion = DPLossFastGradientClipping(
                self.module, self.optimizer, nn.BCEWithLogitsLoss(), "mean"
            )
        else:
            self.module = model
            self.optimizer = DPOptimizerFastGradientClipping(optimizer, **common)
            self._captured: list[tuple[nn.Linear, torch.Tensor, torch.Tensor]] = []
            self._handles = [
                m.register_forward_hook(self._capture)
                for m in model.modules()
                if isinstance(m, nn.Linear)
            ]
        self.accountant = RDPAccountant()
        self.optimizer.attach_step_hook(
            self.accountant.get_optimizer_hook_fn(sample_rate=plan.sample_rate)
        )

    @property
    def steps_taken(self) -> int:
        """The DP-SGD steps Opacus' accountant has counted."""
        return int(sum(steps for _, _, steps in self.accountant.history))

    def noisy_gradient(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Set ``p.grad`` to the noisy mean clipped gradient of the batch; returns the batch loss
        (for the site's own log: it is not released)."""
        self.optimizer.zero_grad()
        with warnings.catch_warnings():
            # Opacus' hooks fire on module outputs when inputs need no gradient: expected here.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss = self._clipped_sum(x, y)
        if self.engine == "bookkeeping":
            # Opacus' pre_step without its gradient-accumulation copy: the clipped sum is
            # already p.grad; Opacus adds the noise, scales and counts the step.
            for p in self.optimizer.params:
                p.summed_grad = p.grad
            self.optimizer.add_noise()
            self.optimizer.scale_grad()
            self.optimizer.step_hook(self.optimizer)
        elif not self.optimizer.pre_step():  # clipping, noise, scaling, accountant step
            raise RuntimeError("Opacus skipped a DP-SGD step")  # cannot happen without accumulation
        return loss

    def _clipped_sum(self, x: torch.Tensor, y: torch.Tensor) -> float:
        if self.engine == "bookkeeping":
            loss = self._bookkeeping(x, y)
        elif self.engine == "ghost":
            out = self.module(x).reshape(-1)
            dp_loss = self._criterion(out, y)
            dp_loss.backward()
            loss = float(dp_loss.item()) if len(y) else 0.0
        else:
            out = self.module(x).reshape(-1)
            batch_loss = binary_loss(out, y)
            batch_loss.backward()
            loss = float(batch_loss.detach()) if len(y) else 0.0
        return loss

    def apply(self) -> None:
        """Take the local optimizer's step with the (noisy, possibly corrected) gradients."""
        self.optimizer.original_optimizer.step()

    def close(self) -> None:
        if self.engine == "bookkeeping":
            for handle in self._handles:
                handle.remove()
        else:
            self.module._close()

    # ------------------------------------------------------------ book-keeping

    def _capture(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self._captured.append((module, inputs[0], output))

    def _bookkeeping(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self._captured.clear()
        out = self.model(x).reshape(-1)
        layers = list(self._captured)
        if len({id(m) for m, _, _ in layers}) != len(layers) or any(
            a.dim() != 2 for _, a, _ in layers
        ):
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="book-keeping clipping needs each linear layer used once on "
                "(batch, features) inputs; ask for engine 'ghost' or 'hooks'",
            )
        loss = binary_loss(out, y, reduction="sum")
        outputs = [o for _, _, o in layers]
        grads = (
            torch.autograd.grad(loss, outputs) if len(y) else [torch.zeros_like(o) for o in outputs]
        )
        squared = torch.zeros(len(y))
        for (module, a, _), g in zip(layers, grads, strict=True):
            g2 = g.pow(2).sum(1)
            squared = squared + g2 * a.pow(2).sum(1)
            if module.bias is not None:
                squared = squared + g2
        factor = torch.clamp(self._clip / (squared.sqrt() + 1e-6), max=1.0)
        for (module, a, _), g in zip(layers, grads, strict=True):
            clipped = g * factor[:, None]
            module.weight.grad = (clipped.T @ a).detach()
            if module.bias is not None:
                module.bias.grad = clipped.sum(0).detach()
        return float(loss.detach()) / max(1, len(y))
