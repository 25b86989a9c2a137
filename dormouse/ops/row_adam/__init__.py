"""SparseRowAdam's row update (train/sparse.py), the op: torch's form (reference.py) or, on CUDA with fp32
moments, dormouse's kernel (triton.py: one pass over the rows of m, v and W where torch's makes ~25)."""

import torch

from dormouse.ops import registry, row_sum
from dormouse.ops.row_adam import reference


def row_adam_(idx, g, keep, step_size, bc2_sqrt, m_all, v_all, p, betas, eps) -> None:
    """For the touched rows `idx` (distinct) with gradient rows `g` [k, D]: where `keep`,
    m ← β1 m + (1 − β1) g, v ← β2 v + (1 − β2) g², and (unless `step_size` is None: lr 0)
    W ← W − step_size · m / (sqrt(v) / bc2_sqrt + eps), per row, in `m_all`, `v_all` and the table `p`."""
    if registry.on_kernel_device(p) and m_all.dtype == torch.float32:
        found = row_sum.kernels(p.device, "dormouse.ops.row_adam.triton")
        found.row_adam_(idx, g.contiguous(), keep, step_size, bc2_sqrt, m_all, v_all, p, betas, eps)
        return
    reference.row_adam_(idx, g, keep, step_size, bc2_sqrt, m_all, v_all, p, betas, eps)
