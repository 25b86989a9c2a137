"""NesterovSinkhorn's momentum and look-ahead (train/optim.py), the op: torch's form (reference.py) or, on
CUDA in fp32, dormouse's kernel (triton.py: one pass where torch's form makes ~14)."""

import torch

from dormouse.ops import registry, sinkhorn
from dormouse.ops.momentum import reference


def momentum_lookahead_(g: torch.Tensor, m: torch.Tensor, beta: float, found_inf: torch.Tensor | None) -> torch.Tensor:
    """M ← kept·M + (1 − β)·G in place, then the look-ahead U = (1 − β)·G + β·M, for a shape group's
    stacked gradients g and momentum m [N, m, n]; kept = β, or 1 with G taken as 0 where `found_inf` is
    non-zero (a skipped step leaves M bit for bit). U is written into g where it can be."""
    if registry.on_kernel_device(g) and g.dtype == torch.float32:
        return sinkhorn.kernels(g.device, "dormouse.ops.momentum.triton").momentum_lookahead_(g, m, beta, found_inf)
    return reference.momentum_lookahead_(g, m, beta, found_inf)
