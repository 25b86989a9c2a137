"""The statistics of `dormouse ab`: the paired difference of two arms over seeds, its 95% interval, the verdict.

Seed round s trains both arms with seed s, so the differences d_s = bpb_B(s) − bpb_A(s) are paired:
what the seed does to both arms (batches, the shared part of the init) cancels in each d_s. With n
seeds the interval is mean(d) ± t · sd(d) / √n, sd with n − 1 in the denominator, t the 0.975
quantile of Student's t with n − 1 degrees of freedom. One seed has no spread: no interval, no verdict.
Lower bpb is better, so an interval wholly below zero says B is better.
"""

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
NO_INTERVAL = "unknown: one seed gives no interval (run --seeds 2 or more)"


def _central_mass(t: float, dof: int) -> float:
    """P(|T| ≤ t) for Student's t with an integer dof: the finite sums of Abramowitz & Stegun 26.7.3/26.7.4."""
    theta = math.atan(t / math.sqrt(dof))
    cos2 = math.cos(theta) ** 2
    if dof % 2:
        term = total = 1.0 if dof > 1 else 0.0
        for k in range(1, (dof - 1) // 2):
            term *= 2 * k / (2 * k + 1) * cos2
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term = total = 1.0
    for k in range(1, dof // 2):
        term *= (2 * k - 1) / (2 * k) * cos2
        total += term
    return math.sin(theta) * total


def t_critical(dof: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided critical value: P(|T| ≤ t) = confidence (bisection on the exact distribution)."""
    if dof < 1:
        raise ValueError(f"Student's t needs dof >= 1, got {dof}")
    lo, hi = 0.0, 1.0
    while _central_mass(hi, dof) < confidence:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _central_mass(mid, dof) < confidence else (lo, mid)
    return (lo + hi) / 2


@dataclass
class PairedDifference:
    n: int  # seeds
    mean: float  # mean of bpb_B − bpb_A
    sd: float | None  # sample standard deviation (n − 1); None with one seed
    t: float | None  # the critical value used; None with one seed
    ci95: tuple[float, float] | None  # None with one seed: the interval is unknown
    verdict: str


def verdict(ci95: tuple[float, float] | None, mean: float) -> str:
    if ci95 is None:
        return NO_INTERVAL
    lo, hi = ci95
    if lo <= 0.0 <= hi:
        return "no difference detected"
    return f"{'B' if hi < 0 else 'A'} better by {abs(mean):.4f} bpb"


def paired_difference(a: list[float], b: list[float]) -> PairedDifference:
    """B − A over seeds paired by position in the lists."""
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    if not diffs:
        raise ValueError("no seeds to compare")
    n, mean = len(diffs), statistics.fmean(diffs)
    if n == 1:
        return PairedDifference(n, mean, None, None, None, verdict(None, mean))
    sd = statistics.stdev(diffs)
    t = t_critical(n - 1)
    half = t * sd / math.sqrt(n)
    ci95 = (mean - half, mean + half)
    return PairedDifference(n, mean, sd, t, ci95, verdict(ci95, mean))
