"""SR-Sinkhorn in torch ops, the definition: `iters` times, every row to ℓ2 norm √n, then every column
to √m, norms clamped below at eps."""

import math

import torch


def sr_sinkhorn(x: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """SR-Sinkhorn of an fp32 or fp64 `x` [.., m, n]: the CPU's path and the kernels' reference."""
    m, n = x.shape[-2:]
    row_target, col_target = math.sqrt(n), math.sqrt(m)
    for _ in range(iters):
        x = x * (row_target / x.norm(dim=-1, keepdim=True).clamp_min(eps))
        x = x * (col_target / x.norm(dim=-2, keepdim=True).clamp_min(eps))
    return x
