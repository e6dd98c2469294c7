"""Multinomial logistic-regression probes for K problems at once, refined from a ridge fit.

Ridge regression on one-hot labels (`isiwatch.measure.ridge`) is one closed-form solve for every layer and feature
kind, but it reads 2–5 accuracy points below logistic regression at some layers. A few batched
preconditioned conjugate-gradient steps on the softmax cross-entropy close that gap. They run in the ridge fit's
SVD basis of the standardised training features, where the Gram matrix is diagonal (s²/n), with a row of ones for
the intercept (curvature 1, not penalised). The preconditioner is the Kronecker-factored Hessian
``diag(s²/n) ⊗ W̄ + λ`` (W̄: the softmax covariance ``diag(p) − ppᵀ`` averaged over the training rows, C×C), applied
per feature direction by one batched C×C solve (``solve_ex``: no error check, so no host–device synchronisation);
directions combine Polak–Ribière style, and each problem moves along its own direction by the exact
one-dimensional Newton step (slope over curvature of the objective along it, capped at `MAX_STEP`). A fixed number
of steps, no per-problem branch and no host read: every step is the same few dozen batched ops for all problems.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .readback import on_device
from .ridge import RidgeFit

#: Conjugate-gradient steps after the ridge warm start.
SOFTMAX_STEPS = 12
#: Largest multiple of a direction one step takes.
MAX_STEP = 16.0
#: Scales tried on the ridge scores to turn them into starting logits (ridge scores of one-hot targets lie in
#: about [0, 1], far flatter than fitted logits).
WARM_SCALES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _objective(logits: Tensor, target: Tensor, weights: Tensor, penalty: Tensor) -> Tensor:
    """Mean cross-entropy plus ``λ/2·|coef|²`` per problem: logits (K,C,n) (classes before images, so reductions
    over the few classes run along contiguous images: the CPU's softmax over a last dimension of 10 is ~20x
    slower), target (C,n), weights (K,R,C) with the intercept as the last row, penalty (R,1) (λ, 0 for the
    intercept) → (K,)."""
    nll = torch.logsumexp(logits, -2) - (logits * target).sum(-2)
    return nll.mean(-1) + 0.5 * (penalty * weights.pow(2)).sum((-2, -1))


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
    k, n, r = u.shape
    lam = 1.0 / n
    ones = u.new_ones(k, n, 1)
    z = torch.cat([u * s.unsqueeze(1), ones], -1)  # (K,n,R): SVD-basis features and the intercept's column
    z_t = z.transpose(1, 2).contiguous()  # (K,R,n)
    penalty = torch.cat([u.new_full((r, 1), lam), u.new_zeros(1, 1)])  # (R,1)
    weights = torch.cat([v.transpose(1, 2) @ fit.weights, fit.bias], 1)  # (K,R,C)
    target = target.t().contiguous()  # (C,n): every (…,C,n) tensor below has the classes before the images
    scores = torch.bmm(weights.transpose(1, 2), z_t)  # (K,C,n)
    warm = on_device(WARM_SCALES, z.device, z.dtype).view(-1, 1, 1, 1)
    tried = _objective(warm * scores, target, warm * weights.unsqueeze(0), penalty)  # (scales, K)
    tau = warm.view(-1)[tried.argmin(0)].view(-1, 1, 1)
    weights, logits = tau * weights, tau * scores
    # per direction r: curvature (s²/n, 1 for the intercept) and damping λ, as (K,R,1,1) and (R,C,C)
    curvature = torch.cat([s.pow(2) / n, ones[:, 0]], -1).view(k, -1, 1, 1)
    damping = lam * torch.eye(target.shape[0], device=z.device, dtype=z.dtype)
    previous: tuple[Tensor, Tensor, Tensor] | None = None
    for _ in range(steps):
        p = logits.softmax(1)  # (K,C,n)
        grad = torch.baddbmm(penalty * weights, z_t, (p - target).transpose(1, 2), alpha=1.0 / n)  # (K,R,C)
        mean_cov = torch.baddbmm(torch.diag_embed(p.mean(-1)), p, p.transpose(1, 2), alpha=-1.0 / n)  # W̄ (K,C,C)
        system = torch.addcmul(damping, curvature, mean_cov.unsqueeze(1))  # (K,R,C,C)
        pre = torch.linalg.solve_ex(system, grad.unsqueeze(-1)).result.squeeze(-1)
        gp = (grad * pre).sum((1, 2))
        direction = pre  # the step goes along −direction
        if previous is not None:  # Polak–Ribière, restarted (β = 0) where it would point uphill
            last_pre, last_direction, last_gp = previous
            beta = ((grad * (pre - last_pre)).sum((1, 2)) / last_gp.clamp_min(1e-30)).clamp_min(0).view(-1, 1, 1)
            direction = torch.addcmul(pre, beta, last_direction)
        d_logits = torch.bmm(direction.transpose(1, 2), z_t)  # (K,C,n)
        # exact Newton step along −direction: the objective's slope (negated) and curvature in t at t = 0; the
        # curvature's data part is Σ over images of the softmax variance of d_logits, Σ p·d² − (Σ p·d)²
        descent = (grad * direction).sum((1, 2))
        pd = p * d_logits
        mean_d = pd.sum(1)  # (K,n)
        spread = torch.addcmul((pd * d_logits).sum(1), mean_d, mean_d, value=-1).sum(-1)
        bend = torch.add((penalty * direction * direction).sum((1, 2)), spread, alpha=1.0 / n)
        t = (descent / bend.clamp_min(1e-12)).clamp(0, MAX_STEP).view(-1, 1, 1)
        weights = torch.addcmul(weights, t, direction, value=-1)
        logits = torch.addcmul(logits, t, d_logits, value=-1)
        previous = (pre, direction, gp)
    return dataclasses.replace(fit, weights=v @ weights[:, :r], bias=weights[:, r:], spectrum=None)
