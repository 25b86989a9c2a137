"""dormouse's own Triton kernels for the SwiGLU's fused path: `silu(gate) * up` and its two gradients.

Each program takes a tile of rows × columns, so a row's columns are contiguous in every load and store.
fla's SwiGLU kernels walk the tensor as one flat index (row = i // H, column = i % H), which keeps the
compiler from vectorising: on an H200 at the `small` B 64 shape ([32768, 1536] halves of the
[32768, 3072] gate-up projection) they take 104 us forward and 169 us backward (~2.9 TB/s); these take
71 and 118 (~4.3 TB/s). The arithmetic is fla's, term for term, in fp32 with one rounding to the inputs'
dtype: the same bits as fla's kernels (tests/gpu/test_swiglu_fused.py checks it).

Imported only where Triton is (CUDA machines; the dev set-up, whose tests run it under Triton's
interpreter): `swiglu.fused_kernels()` looks it up. The tile is fixed by the row length (no autotuning at a
cold start; two processes run the same kernels).

Layouts: gate, up, g [N, H] with unit stride over H (a column slice of a wider tensor is fine); z
contiguous; d_gate, d_up [N, H] with unit stride over H (the halves of one [N, 2H] gradient).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel(x, y, z, N, s_x, s_y, H: tl.constexpr, BR: tl.constexpr, BH: tl.constexpr):
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * BH + tl.arange(0, BH))[None, :]
    m = (rows < N) & (cols < H)
    b_x = tl.load(x + rows * s_x + cols, mask=m, other=0.0).to(tl.float32)
    b_y = tl.load(y + rows * s_y + cols, mask=m, other=0.0).to(tl.float32)
    b_z = b_x * tl.sigmoid(b_x) * b_y
    tl.store(z + rows * H + cols, b_z.to(z.dtype.element_ty), mask=m)


@triton.jit
def _bwd_kernel(x, y, g, dx, dy, N, s_x, s_y, s_g, s_dx, s_dy, H: tl.constexpr, BR: tl.constexpr, BH: tl.constexpr):
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * BH + tl.arange(0, BH))[None, :]
    m = (rows < N) & (cols < H)
    b_x = tl.load(x + rows * s_x + cols, mask=m, other=0.0).to(tl.float32)
    b_y = tl.load(y + rows * s_y + cols, mask=m, other=0.0).to(tl.float32)
    b_g = tl.load(g + rows * s_g + cols, mask=m, other=0.0).to(tl.float32)
    b_s = tl.sigmoid(b_x)
    b_xs = b_x * b_s
    b_dx = b_g * b_s * (1.0 + b_x * (1.0 - b_s)) * b_y
    b_dy = b_g * b_xs
    tl.store(dx + rows * s_dx + cols, b_dx.to(dx.dtype.element_ty), mask=m)
    tl.store(dy + rows * s_dy + cols, b_dy.to(dy.dtype.element_ty), mask=m)


def _tile(H: int) -> tuple[int, int, int]:
    """A tile's rows and columns and its warps: ~2048 elements, whole rows where they fit (the probe's
    fastest at H 1536: one row of 2048 columns, 8 warps)."""
    BH = min(triton.next_power_of_2(H), 2048)
    return max(1, 2048 // BH), BH, 8


def _check(*tensors: torch.Tensor) -> None:
    assert all(t.ndim == 2 and t.stride(1) == 1 for t in tensors), [(t.shape, t.stride()) for t in tensors]


def forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate, up [N, H], contiguous [N, H] in gate's dtype."""
    _check(gate, up)
    N, H = gate.shape
    BR, BH, warps = _tile(H)
    z = torch.empty(N, H, dtype=gate.dtype, device=gate.device)
    if z.numel() == 0:
        return z
    grid = (triton.cdiv(N, BR), triton.cdiv(H, BH))
    _fwd_kernel[grid](gate, up, z, N, gate.stride(0), up.stride(0), H=H, BR=BR, BH=BH, num_warps=warps)
    return z


def backward(gate: torch.Tensor, up: torch.Tensor, g: torch.Tensor, d_gate: torch.Tensor, d_up: torch.Tensor) -> None:
    """Writes the gradients of silu(gate) * up for the output's gradient g into d_gate and d_up ([N, H])."""
    _check(gate, up, g, d_gate, d_up)
    N, H = gate.shape
    if gate.numel() == 0:
        return
    BR, BH, warps = _tile(H)
    grid = (triton.cdiv(N, BR), triton.cdiv(H, BH))
    _bwd_kernel[grid](
        gate, up, g, d_gate, d_up, N, gate.stride(0), up.stride(0), g.stride(0), d_gate.stride(0), d_up.stride(0),
        H=H, BR=BR, BH=BH, num_warps=warps,
    )  # fmt: skip
