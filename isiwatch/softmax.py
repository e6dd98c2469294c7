"""Multinomial logistic-regression probes for K problems at once, refined from a ridge fit.

Ridge regression on one-hot labels (:mod:`isiwatch.ridge`) is one closed-form solve for every layer and feature
kind, but it reads 2–5 accuracy points below logistic regression at some layers. A few batched
quasi-Newton steps on the softmax cross-entropy close that gap. They run in the ridge fit's SVD basis of the
standardised training features, where the Gram matrix is diagonal (s²), so the Hessian
``(s²/n) ⊗ W + λ`` (W: the mean softmax covariance, replaced by its mean eigenvalue) is inverted elementwise.
Each problem then moves along its own direction by the exact one-dimensional Newton step (slope over curvature
of the objective along it, capped at :data:`MAX_STEP`): a fixed number of steps, no per-problem branch, no
host–device synchronisation.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .ridge import RidgeFit

#: Quasi-Newton steps after the ridge warm start.
SOFTMAX_STEPS = 12
#: Largest multiple of a direction one step takes.
MAX_STEP = 16.0
#: Scales tried on the ridge scores to turn them into starting logits (ridge scores of one-hot targets lie in
#: about [0, 1], far flatter than fitted logits).
WARM_SCALES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _objective(logits: Tensor, target: Tensor, coef: Tensor, lam: float) -> Tensor:
    """Mean cross-entropy plus ``lam/2·|coef|²`` per problem: (K,n,C), (n,C), (K,r,C) → (K,)."""
    nll = torch.logsumexp(logits, -1) - (logits * target).sum(-1)
    return nll.mean(-1) + 0.5 * lam * coef.pow(2).sum((1, 2))


def _best(candidates: Tensor, values: Tensor) -> Tensor:
    """The value of ``values`` (T,) at each problem's smallest objective in ``candidates`` (T,K), as (K,1,1)."""
    return values[candidates.argmin(0)].view(-1, 1, 1)


def fit_softmax(fit: RidgeFit, target: Tensor, steps: int = SOFTMAX_STEPS) -> RidgeFit:
    """Refine ``fit`` (from :func:`isiwatch.ridge.fit_ridge` on one-hot ``target`` (n,C)) into multinomial
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
    z = u * s.unsqueeze(1)  # (K,n,r): centred standardised features in the SVD basis
    coef = v.transpose(1, 2) @ fit.weights  # (K,r,C)
    scores = z @ coef
    warm = torch.tensor(WARM_SCALES, device=z.device, dtype=z.dtype)
    tau = _best(torch.stack([_objective(t * (scores + fit.bias), target, t * coef, lam) for t in WARM_SCALES]), warm)
    coef, bias = tau * coef, tau * fit.bias
    logits = z @ coef + bias
    curvature = s.pow(2).unsqueeze(-1) / n  # (K,r,1)
    zt = z.transpose(1, 2).contiguous()
    classes = target.shape[-1]
    for _ in range(steps):
        p = logits.softmax(-1)
        resid = (p - target) / n
        grad_coef = zt @ resid + lam * coef
        spread = ((1 - p.pow(2).sum(-1)).mean(-1) / max(classes - 1, 1)).clamp_min(1e-6).view(-1, 1, 1)
        d_coef = -grad_coef / (curvature * spread + lam)
        d_bias = -resid.sum(1, keepdim=True) / spread
        d_logits = z @ d_coef + d_bias
        # exact Newton step along the direction: slope and curvature of the objective in t at t = 0
        slope = (resid * d_logits).sum((1, 2)) + lam * (coef * d_coef).sum((1, 2))
        pd = p * d_logits
        bend = ((pd * d_logits).sum(-1) - pd.sum(-1).pow(2)).mean(-1) + lam * d_coef.pow(2).sum((1, 2))
        t = (-slope / bend.clamp_min(1e-12)).clamp(0, MAX_STEP).view(-1, 1, 1)
        coef, bias, logits = coef + t * d_coef, bias + t * d_bias, logits + t * d_logits
    return dataclasses.replace(fit, weights=v @ coef, bias=bias, spectrum=None)
