"""dormouse's Triton kernel for NesterovSinkhorn's momentum and look-ahead on CUDA (train/optim.py's
`momentum_lookahead_` of one shape group's stacks).

    M ← kept · M + (1 − β) · G,   U = (1 − β) · G + β · M      (kept = β; 1 with G taken as 0 on a skipped step)

One pass reads G and M and writes M and U (into G's storage). torch's form runs, per shape group, a
`where` on G, two `_foreach` ops on the buffers, a stack of them, a product and a sum: ~14 passes of the
group's fp32 matrices where this is 4 (docs/performance.md). The arithmetic is torch's, each
product and sum in fp32; the compiler may fuse a product and a sum into one rounding where torch's kernels
round twice (within fp32's error: tests/gpu/test_sinkhorn_kernels.py). The block is fixed.

Imported only where Triton is (CUDA machines; the dev set-up, whose tests run it under Triton's
interpreter): `ops.sinkhorn.kernels(device, "dormouse.ops.momentum.triton")` looks it up.
"""

import torch
import triton
import triton.language as tl

BLOCK = 1024  # 8 elements a thread: 32 registers (benches/compile_kernels.py), many warps per SM
WARPS = 4


@triton.jit
def _momentum_kernel(g, m, found_inf, n, beta, one_minus_beta, SKIPPABLE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    b_g = tl.load(g + offs, mask=mask, other=0.0)
    b_m = tl.load(m + offs, mask=mask, other=0.0)
    kept = beta
    if SKIPPABLE:  # found_inf != 0: the step is skipped, M kept as it is (G may be non-finite)
        run = tl.load(found_inf) == 0
        b_g = tl.where(run, b_g, 0.0)
        kept = tl.where(run, beta, 1.0)
    b_m = b_m * kept + b_g * one_minus_beta
    tl.store(m + offs, b_m, mask=mask)
    tl.store(g + offs, b_g * one_minus_beta + b_m * beta, mask=mask)


def momentum_lookahead_(g: torch.Tensor, m: torch.Tensor, beta: float, found_inf: torch.Tensor | None) -> torch.Tensor:
    """The module docstring's update of contiguous fp32 stacks g (the gradients) and m (the momentum, in
    place); returns U, written into g."""
    if not (g.is_contiguous() and m.is_contiguous() and g.dtype == m.dtype == torch.float32 and g.shape == m.shape):
        raise ValueError(f"the momentum kernel takes two contiguous fp32 stacks of one shape; got {g.shape}, {m.shape}")
    n = g.numel()
    if n:
        skippable = found_inf is not None
        _momentum_kernel[(triton.cdiv(n, BLOCK),)](
            g, m, found_inf if skippable else g, n, beta, 1 - beta, SKIPPABLE=skippable, BLOCK=BLOCK, num_warps=WARPS
        )
    return g
