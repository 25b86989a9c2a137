"""dormouse's Triton kernel for summing a table gradient's rows by distinct row on CUDA (train/sparse.py's
`RowPlan.coalesce`).

torch's CUDA `coalesce` sorts the row indices (thrust's merge sort by key: stable), then
`coalesceValuesKernel` adds each distinct row's gradient rows one by one, from zero, in fp32. This is
that sum, read through the plan's stable order, without the host sync torch's takes to count the rows:
the same additions in the same order, so the same bits (tests/gpu/test_row_plan.py). `index_add_` in
deterministic mode gives other bits and takes 0.57 ms a step at B 64 on an H200.

Imported only where Triton is (CUDA machines; the dev set-up, whose tests run it under Triton's
interpreter): `ops.row_sum.kernels()` looks it up.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _row_sums_kernel(values, order, bounds, out, D: tl.constexpr, BLOCK: tl.constexpr):
    """out[r] = Σ values[order[i]] for i in bounds[r] .. bounds[r + 1], in that order from zero; one
    program a distinct row."""
    r = tl.program_id(0).to(tl.int64)
    begin = tl.load(bounds + r)
    end = tl.load(bounds + r + 1)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(begin, end):
        src = tl.load(order + i)
        acc += tl.load(values + src * D + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + r * D + cols, acc.to(out.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    """Warps for a row of `block` columns: one per 128 (an engram row of 64 is one warp; the default four
    leave three idle, and fewer programs fit on an SM; 0.149 ms a step at B 64 with four)."""
    return max(1, min(4, block // 128))


def row_sums(values: torch.Tensor, order: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """[k, D]: each distinct row's sum of `values` [N, D] rows, taken in `order` [N] between `bounds` [k + 1]."""
    k, d = bounds.shape[0] - 1, values.shape[1]
    out = values.new_empty((k, d))
    if k:
        block = triton.next_power_of_2(d)
        _row_sums_kernel[(k,)](values.contiguous(), order, bounds, out, D=d, BLOCK=block, num_warps=_warps(block))
    return out
