"""Multinomial logistic-regression probes for K problems at once, refined from a ridge fit.

Ridge regression on one-hot labels (`isiwatch.measure.ridge`) is one closed-form solve for every layer and feature
kind, but it reads 2–5 accuracy points below logistic regression at some layers. A few batched
preconditioned conjugate-gradient steps on the softmax cross-entropy close that gap. They run in the ridge fit's
SVD basis of the standardised training features, where the Gram matrix is diagonal (s²/n). The preconditioner is
the Kronecker-factored Hessian ``diag(s²/n) ⊗ W̄ + λ`` (W̄: the softmax covariance ``diag(p) − ppᵀ`` averaged over
the training rows, C×C), inverted through W̄'s eigendecomposition; directions combine Polak–Ribière style, and
each problem moves along its own direction by the exact one-dimensional Newton step (slope over curvature of the
objective along it, capped at `MAX_STEP`). A fixed number of steps and no per-problem branch; on CUDA the
only host–device synchronisation is each step's batched C×C ``eigh`` checking its result (one per step for all
problems, never per layer). Tensors are class-major, (K,C,n): with few classes, products with n columns are
several times faster than products with C columns.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .ridge import RidgeFit

#: Conjugate-gradient steps after the ridge warm start.
SOFTMAX_STEPS = 12
#: Largest multiple of a direction one step takes.
MAX_STEP = 16.0
#: Scales tried on the ridge scores to turn them into starting logits (ridge scores of one-hot targets lie in
#: about [0, 1], far flatter than fitted logits).
WARM_SCALES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _objective(logits: Tensor, target: Tensor, coef: Tensor, lam: float) -> Tensor:
    """Mean cross-entropy plus ``lam/2·|coef|²`` per problem: (K,C,n), (C,n), (K,C,r) → (K,)."""
    nll = torch.logsumexp(logits, 1) - (logits * target).sum(1)
    return nll.mean(-1) + 0.5 * lam * coef.pow(2).sum((1, 2))


def _dot(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> Tensor:
    """Per-problem inner product of two (coef, bias) pairs: (K,)."""
    return (a[0] * b[0]).sum((1, 2)) + (a[1] * b[1]).sum((1, 2))


def _preconditioned(grad: tuple[Tensor, Tensor], p: Tensor, curvature: Tensor, lam: float) -> tuple[Tensor, Tensor]:
    """The gradient (coef (K,C,r), bias (K,C,1)) times the inverse Kronecker-factored Hessian at probabilities p."""
    n = p.shape[-1]
    mean_cov = torch.diag_embed(p.mean(-1)) - (p @ p.transpose(1, 2)) / n  # W̄ (K,C,C)
    eigval, eigvec = torch.linalg.eigh(mean_cov)
    eigval = eigval.clamp_min(0).unsqueeze(-1)  # (K,C,1)
    basis = eigvec.transpose(1, 2)
    coef = eigvec @ ((basis @ grad[0]) / (eigval * curvature + lam))
    # the intercept is not penalised; damping its curvature by lam too keeps the step finite where a class's
    # probability vanishes (a class absent from the training split: its logit falls without bound)
    bias = eigvec @ ((basis @ grad[1]) / (eigval + lam))
    return coef, bias


def fit_softmax(fit: RidgeFit, target: Tensor, steps: int = SOFTMAX_STEPS) -> RidgeFit:
    """Refine ``fit`` (from `isiwatch.measure.ridge.fit_ridge` on one-hot ``target`` (n,C)) into multinomial
    logistic regressions; returns the same linear form, whose ``predict`` gives logits.

    The penalty is scikit-learn's ``LogisticRegression`` default (C = 1: ``|W|²/2`` against the summed loss,
    intercept free) on the standardised features: fixed, so nothing is tuned on held-out data; the ridge
    regulariser, chosen by leave-one-out on the training split, sets only the starting point.
    """
    if fit.spectrum is None:  # unpacking None would be a TypeError too
        raise TypeError("fit_softmax needs fit_ridge's output: this fit keeps no spectrum (a refined fit drops it)")
    u, s, v = fit.spectrum
    n = u.shape[1]
    lam = 1.0 / n
    z_t = (u * s.unsqueeze(1)).transpose(1, 2).contiguous()  # (K,r,n): centred standardised features, SVD basis
    z = z_t.transpose(1, 2).contiguous()
    target = target.t().contiguous()  # (C,n)
    coef = fit.weights.transpose(1, 2) @ v  # (K,C,r)
    bias = fit.bias.transpose(1, 2)  # (K,C,1)
    scores = coef @ z_t
    warm = torch.tensor(WARM_SCALES, device=z.device, dtype=z.dtype)
    tried = torch.stack([_objective(t * (scores + bias), target, t * coef, lam) for t in WARM_SCALES])
    tau = warm[tried.argmin(0)].view(-1, 1, 1)
    coef, bias = tau * coef, tau * bias
    logits = coef @ z_t + bias
    curvature = (s.pow(2) / n).unsqueeze(1)  # (K,1,r)
    previous: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], Tensor] | None = None
    for _ in range(steps):
        p = logits.softmax(1)
        resid = (p - target) / n
        grad = (resid @ z + lam * coef, resid.sum(-1, keepdim=True))
        pre = _preconditioned(grad, p, curvature, lam)
        gp = _dot(grad, pre)
        direction = (-pre[0], -pre[1])
        if previous is not None:  # Polak–Ribière, restarted (β = 0) where it would point uphill
            last_pre, last_direction, last_gp = previous
            beta = ((gp - _dot(grad, last_pre)) / last_gp.clamp_min(1e-30)).clamp_min(0).view(-1, 1, 1)
            direction = (direction[0] + beta * last_direction[0], direction[1] + beta * last_direction[1])
        d_logits = direction[0] @ z_t + direction[1]
        # exact Newton step along the direction: slope and curvature of the objective in t at t = 0
        slope = (resid * d_logits).sum((1, 2)) + lam * (coef * direction[0]).sum((1, 2))
        pd = p * d_logits
        bend = ((pd * d_logits).sum(1) - pd.sum(1).pow(2)).mean(-1) + lam * direction[0].pow(2).sum((1, 2))
        t = (-slope / bend.clamp_min(1e-12)).clamp(0, MAX_STEP).view(-1, 1, 1)
        coef, bias, logits = coef + t * direction[0], bias + t * direction[1], logits + t * d_logits
        previous = (pre, direction, gp)
    return dataclasses.replace(fit, weights=(coef @ v.transpose(1, 2)).transpose(1, 2), bias=bias.transpose(1, 2),
                               spectrum=None)
