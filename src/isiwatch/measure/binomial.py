"""Exact one-sided bounds of a binomial proportion (Clopper–Pearson) and the test built on them: what truncate's
accuracy-drop bound and the Watch's probe comparisons both decide by (scipy's beta quantiles, imported when
first needed)."""

from __future__ import annotations

__all__ = ["above_chance", "clopper_pearson_lower", "clopper_pearson_upper"]


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """The one-sided (1 − alpha) upper bound of a binomial proportion."""
    if successes >= trials:
        return 1.0
    from scipy.stats import beta

    return float(beta.ppf(1 - alpha, successes + 1, trials - successes))


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """The one-sided (1 − alpha) lower bound of a binomial proportion."""
    if successes <= 0:
        return 0.0
    from scipy.stats import beta

    return float(beta.ppf(alpha, successes, trials - successes + 1))


def above_chance(correct: int, images: int, chance: float, alpha: float) -> bool:
    """Whether ``correct`` of ``images`` is significantly above the accuracy ``chance`` (a fraction): the
    one-sided exact (Clopper–Pearson) test at level ``alpha``, its lower bound above ``chance``."""
    return clopper_pearson_lower(correct, images, alpha) > chance
