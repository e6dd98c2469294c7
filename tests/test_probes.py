import numpy as np
import pytest
import torch

from isiwatch.probes import probe_accuracy, split_indices
from isiwatch.ridge import fit_ridge, neg_mse_score


def test_split_is_deterministic_and_disjoint():
    a_train, a_test = split_indices(100, 0.7, seed=3)
    b_train, b_test = split_indices(100, 0.7, seed=3)
    assert torch.equal(a_train, b_train) and torch.equal(a_test, b_test)
    assert len(a_train) == 70 and set(a_train.tolist()).isdisjoint(a_test.tolist())
    assert not torch.equal(split_indices(100, 0.7, seed=4)[0], a_train)


def test_ridge_matches_normal_equations_and_brute_force_loo():
    torch.manual_seed(0)
    x = torch.randn(2, 40, 5, dtype=torch.float64)
    y = torch.randn(40, 3, dtype=torch.float64)
    losses = {}
    for alpha in (0.01, 1.0, 100.0):
        fit = fit_ridge(x, y, lambda p: neg_mse_score(p, y), alphas=[alpha])
        xs = ((x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)).numpy()
        yc = (y - y.mean(0)).numpy()
        for k in range(2):
            s = np.linalg.svd(xs[k], compute_uv=False)
            lam = alpha * np.mean(s ** 2)
            w = np.linalg.solve(xs[k].T @ xs[k] + lam * np.eye(5), xs[k].T @ yc)
            np.testing.assert_allclose(fit.weights[k].numpy(), w, rtol=1e-8)
        # brute-force leave-one-out on problem 0 (standardisation fixed on all rows, intercept refit)
        errs = []
        for i in range(40):
            keep = [j for j in range(40) if j != i]
            xk, yk = xs[0][keep], y.numpy()[keep]
            mu = yk.mean(0)
            w = np.linalg.solve(
                (xk - xk.mean(0)).T @ (xk - xk.mean(0)) + lam_for(xs[0], alpha) * np.eye(5),
                (xk - xk.mean(0)).T @ (yk - mu))
            errs.append(((xs[0][i] - xk.mean(0)) @ w + mu - y.numpy()[i]) ** 2)
        losses[alpha] = np.mean(errs)
    best = min(losses, key=losses.get)
    chosen = fit_ridge(x[:1], y, lambda p: neg_mse_score(p, y), alphas=list(losses)).alpha.item()
    assert chosen == best


def lam_for(xs, alpha):
    return alpha * np.mean(np.linalg.svd(xs, compute_uv=False) ** 2)


def test_probe_accuracy_separates_informative_from_noise_features():
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(300) % 3
    informative = torch.nn.functional.one_hot(labels, 3).float() * 3 + torch.randn(300, 3, generator=gen)
    informative = torch.cat([informative, torch.randn(300, 13, generator=gen)], 1)
    noise = torch.randn(300, 16, generator=gen)
    train, test = split_indices(300, 0.7, seed=0)
    acc = probe_accuracy(torch.stack([informative, noise]), labels, train, test)
    assert acc[0] > 0.9
    assert acc[1] == pytest.approx(1 / 3, abs=0.12)
