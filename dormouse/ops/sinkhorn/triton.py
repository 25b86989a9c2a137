"""dormouse's Triton kernels for SR-Sinkhorn on CUDA (train/optim.py's `sr_sinkhorn` of a stack [N, m, n]).

Every half-iteration of SR-Sinkhorn scales rows (or columns) of the current matrix, so after any number
of them the matrix is diag(r) · U · diag(c) for the input U and two scale vectors. These kernels keep U
as it is and update only r [N, m] and c [N, n]:

    row step     r_i ← r_i · √n / max(r_i · ‖U_i ⊙ c‖, eps)
    column step  c_j ← c_j · √m / max(c_j · ‖r ⊙ U_:j‖, eps)

the norms being those of the current matrix's rows and columns, as torch's form takes them (clamped
below at eps). A row or column whose norm is exactly zero keeps its scale: it is zero whatever the scale,
and the clamp's factor √n/eps, compounded over the iterations, would overflow to inf (inf · 0 = NaN). At
the end one pass writes X = r_i · U_ij · c_j.

An iteration reads U twice (the row norms, one program a row; the column sums of squares in blocks of
rows) and writes nothing of its size; a tiny kernel adds each column's blocks in a fixed order and
updates c. `sinkhorn_step_` ends in NesterovSinkhorn's step itself, W ← W · decay − lr · X written into
the weights (their addresses in a table: the matrices of a shape are separate tensors), so X, X · lr and
the decayed W are never tensors of their own. Rescaling the matrix in place instead takes five passes
of it an iteration, 0.41 ms a `small` step on an H200. The arithmetic differs from
torch's form only in where it rounds (products of scales instead of successive rescalings; the step's
product and difference perhaps fused into one rounding) and in the order of the sums, within fp32's
error (tests/gpu/test_sinkhorn_kernels.py). fp32 only: fp64, the reference precision, stays
torch's. Blocks are fixed: no autotuning, the same kernels in every process, the same bits every call.

Imported only where Triton is (CUDA machines; the dev set-up, whose tests run it under Triton's
interpreter): `ops.sinkhorn.kernels()` looks it up.
"""

import math

import torch
import triton
import triton.language as tl

ROW_BLOCK = 4096  # columns a row program holds at once (it loops over wider rows)
ROWS_PER_PART = 64  # rows one column-sum program adds: parts [N, ⌈m / 64⌉, n]
PARTS_AT_ONCE = 64  # parts a column program loads at once (it loops over more)
COLUMN_BLOCK = 64  # columns one column-sum or column-scale program takes
TILE = (32, 64)  # (rows, columns) of one program of the final pass


@triton.jit
def _rescale(scale, norm, target, eps):
    """scale · target / max(norm, eps), or scale where the norm is zero (see the module docstring)."""
    return tl.where(norm > 0, scale * (target / tl.maximum(norm, eps)), scale)


@triton.jit
def _rows_kernel(u, r, c, m, n, target, eps, BLOCK: tl.constexpr, WHOLE: tl.constexpr, FIRST: tl.constexpr):
    """r[row] for the current row's norm r · ‖u row ⊙ c‖; one program a row of the stack. FIRST: the
    first iteration, every scale 1 (r and c not yet written)."""
    row = tl.program_id(0).to(tl.int64)
    c_row = c + (row // m) * n
    cols = tl.arange(0, BLOCK)
    if WHOLE:  # the row fits one block
        mask = cols < n
        v = tl.load(u + row * n + cols, mask=mask, other=0.0)
        if not FIRST:
            v *= tl.load(c_row + cols, mask=mask, other=0.0)
        ss = tl.sum(v * v, axis=0)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n, BLOCK):
            mask = start + cols < n
            v = tl.load(u + row * n + start + cols, mask=mask, other=0.0)
            if not FIRST:
                v *= tl.load(c_row + start + cols, mask=mask, other=0.0)
            acc += v * v
        ss = tl.sum(acc, axis=0)
    scale = 1.0 if FIRST else tl.load(r + row)
    tl.store(r + row, _rescale(scale, scale * tl.sqrt(ss), target, eps))


@triton.jit
def _column_parts_kernel(u, r, part, m, n, parts, RB: tl.constexpr, BC: tl.constexpr):
    """part[matrix, row block, column] = Σ (r_i · u_ij)² over the block's RB rows."""
    mat, i_c, i_r = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    cols = i_c * BC + tl.arange(0, BC)
    rows = i_r * RB + tl.arange(0, RB)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    v = tl.load(u + mat * m * n + rows[:, None] * n + cols[None, :], mask=mask, other=0.0)
    v *= tl.load(r + mat * m + rows, mask=rows < m, other=0.0)[:, None]
    tl.store(part + (mat * parts + i_r) * n + cols, tl.sum(v * v, axis=0), mask=cols < n)


@triton.jit
def _columns_kernel(part, c, n, parts, target, eps, PB: tl.constexpr, BC: tl.constexpr, FIRST: tl.constexpr):
    """c[column] for the current column's norm c · sqrt(Σ parts), the parts added in their order (FIRST:
    c not yet written, every scale 1)."""
    mat, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = i_c * BC + tl.arange(0, BC)
    ss = tl.zeros([BC], dtype=tl.float32)
    for start in range(0, parts, PB):
        blocks = start + tl.arange(0, PB)
        mask = (blocks[:, None] < parts) & (cols[None, :] < n)
        ss += tl.sum(tl.load(part + (mat * parts + blocks[:, None]) * n + cols[None, :], mask=mask, other=0.0), axis=0)
    scale = tl.full([BC], 1.0, tl.float32) if FIRST else tl.load(c + mat * n + cols, mask=cols < n, other=0.0)
    tl.store(c + mat * n + cols, _rescale(scale, scale * tl.sqrt(ss), target, eps), mask=cols < n)


@triton.jit
def _apply_kernel(
    u, r, c, x, lr, decay, m, n, BR: tl.constexpr, BC: tl.constexpr, STEP: tl.constexpr, IN_MEMORY: tl.constexpr
):
    """x = r_i · u_ij · c_j. STEP: W ← W · decay − lr · x instead, W the fp32 matrix whose address x (an int64
    table) holds for this matrix of the stack; lr and decay numbers, or IN_MEMORY: the addresses of two."""
    mat, i_c, i_r = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    cols = i_c * BC + tl.arange(0, BC)
    rows = i_r * BR + tl.arange(0, BR)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    b_r = tl.load(r + mat * m + rows, mask=rows < m, other=0.0)
    b_c = tl.load(c + mat * n + cols, mask=cols < n, other=0.0)
    v = tl.load(u + mat * m * n + rows[:, None] * n + cols[None, :], mask=mask, other=0.0)
    b_x = (b_r[:, None] * v) * b_c[None, :]
    if STEP:
        w = tl.load(x + mat).to(tl.pointer_type(tl.float32)) + rows[:, None] * n + cols[None, :]
        s_lr = tl.load(lr) if IN_MEMORY else lr
        s_decay = tl.load(decay) if IN_MEMORY else decay
        tl.store(w, tl.load(w, mask=mask, other=0.0) * s_decay - b_x * s_lr, mask=mask)
    else:
        tl.store(x + mat * m * n + rows[:, None] * n + cols[None, :], b_x, mask=mask)


def _check(u: torch.Tensor) -> torch.Tensor:
    if u.dtype != torch.float32 or u.ndim != 3:
        raise ValueError(f"the SR-Sinkhorn kernels take an fp32 stack [N, m, n]; got {u.dtype} {tuple(u.shape)}")
    return u.contiguous()


def _scales(u: torch.Tensor, iters: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(r [N, m], c [N, n]) of the SR-Sinkhorn of u: X = diag(r) · u · diag(c) (module docstring)."""
    N, m, n = u.shape
    r = torch.empty(N, m, dtype=u.dtype, device=u.device)  # written by the first iteration
    c = torch.empty(N, n, dtype=u.dtype, device=u.device)
    parts = triton.cdiv(m, ROWS_PER_PART)
    part = torch.empty(N, parts, n, dtype=u.dtype, device=u.device)
    block = min(triton.next_power_of_2(n), ROW_BLOCK)
    col_blocks = triton.cdiv(n, COLUMN_BLOCK)
    for i in range(iters):
        _rows_kernel[(N * m,)](u, r, c, m, n, math.sqrt(n), eps, BLOCK=block, WHOLE=block >= n, FIRST=i == 0)
        _column_parts_kernel[(N, col_blocks, parts)](u, r, part, m, n, parts, RB=ROWS_PER_PART, BC=COLUMN_BLOCK)
        _columns_kernel[(N, col_blocks)](
            part, c, n, parts, math.sqrt(m), eps, PB=PARTS_AT_ONCE, BC=COLUMN_BLOCK, FIRST=i == 0
        )
    return r, c


def _apply(u, r, c, x, lr, decay, *, step: bool, in_memory: bool) -> None:
    N, m, n = u.shape
    rows_of, cols_of = TILE
    grid = (N, triton.cdiv(n, cols_of), triton.cdiv(m, rows_of))
    _apply_kernel[grid](u, r, c, x, lr, decay, m, n, BR=rows_of, BC=cols_of, STEP=step, IN_MEMORY=in_memory)


def sr_sinkhorn(u: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """SR-Sinkhorn of a CUDA fp32 stack u [N, m, n], in a new tensor; u unchanged."""
    u = _check(u)
    x = torch.empty_like(u)
    if u.numel():
        r, c = _scales(u, iters, eps)
        _apply(u, r, c, x, 0.0, 0.0, step=False, in_memory=False)
    return x


def sinkhorn_step_(u: torch.Tensor, iters: int, eps: float, weights: torch.Tensor, lr, decay) -> None:
    """W_i ← W_i · decay − lr · X_i for X the SR-Sinkhorn of a CUDA fp32 stack u [N, m, n], written into
    the N contiguous fp32 [m, n] matrices whose addresses `weights` (int64 [N], on u's device) holds:
    NesterovSinkhorn's step without X or its products as tensors of their own. lr and decay are both
    numbers or both 0-dim fp32 tensors on u's device (a captured step reads them there)."""
    u = _check(u)
    if weights.shape != (u.shape[0],) or weights.dtype != torch.int64 or weights.device != u.device:
        raise ValueError(f"weights must be the {u.shape[0]} matrices' int64 addresses on {u.device}")
    in_memory = isinstance(lr, torch.Tensor)
    if in_memory != isinstance(decay, torch.Tensor):
        raise TypeError("lr and decay must both be numbers or both be tensors")
    if u.numel():
        r, c = _scales(u, iters, eps)
        _apply(u, r, c, weights, lr, decay, step=True, in_memory=in_memory)
