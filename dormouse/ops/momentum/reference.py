"""NesterovSinkhorn's momentum and look-ahead in torch ops, the definition."""

import torch


def momentum_lookahead_(g: torch.Tensor, m: torch.Tensor, beta: float, found_inf: torch.Tensor | None) -> torch.Tensor:
    """M ← kept·M + (1 − β)·G in place, then U = (1 − β)·G + β·M written into g (ops/momentum/)."""
    kept = beta
    if found_inf is not None:
        run = found_inf == 0
        g = torch.where(run, g, 0.0)  # the skipped step's gradient may be non-finite: M must not see it
        kept = torch.where(run, beta, 1.0)
    m.mul_(kept).add_(g, alpha=1 - beta)
    return g.mul_(1 - beta).add_(m, alpha=beta)
