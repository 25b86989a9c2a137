"""A table gradient's rows summed by distinct row (train/sparse.py's `RowPlan.coalesce`), the op: torch's
`index_add_` (reference.py) or, on CUDA, dormouse's kernel (triton.py: torch's CUDA coalesce's additions
and bits, without its host sync)."""

import torch

from dormouse import ledger
from dormouse.ops import registry
from dormouse.ops.row_sum import reference

ROW_SUM_KERNELS_UNAVAILABLE = ledger.register(
    "sparse.row_sum_kernels_unavailable",
    ledger.Kind.LOUD,
    "a table gradient coalesced on CUDA by a RowPlan (a --cuda-graph step), or SparseRowAdam's fp32 step on "
    "CUDA, runs dormouse's Triton kernels (ops/row_sum/triton.py, ops/row_adam/triton.py), and they are "
    "not importable (no Triton)",
    __name__,
)


def kernels(device: torch.device, module: str = "dormouse.ops.row_sum.triton"):
    """dormouse's Triton kernels for the tables on `device` (CUDA): `module`, the row sums' or
    "dormouse.ops.row_adam.triton"; refused at `sparse.row_sum_kernels_unavailable` where Triton is not
    importable."""
    found = registry.own_kernels(module)
    what = f"the engram tables' gradient and update on {device}"
    return registry.required(found, ROW_SUM_KERNELS_UNAVAILABLE, what)


def row_sums(values: torch.Tensor, order: torch.Tensor, bounds: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """[k, D] for the k = len(bounds) - 1 distinct rows: each one's gradient rows of `values` [N, D] added
    one by one in `order`, from zero (`bounds`: where each begins in that order; `starts`: the same as a
    mask)."""
    if registry.on_kernel_device(values):
        return kernels(values.device).row_sums(values, order, bounds)
    return reference.row_sums(values, order, starts, bounds.shape[0] - 1)
