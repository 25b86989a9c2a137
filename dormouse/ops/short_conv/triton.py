"""dormouse's own Triton kernels for the short conv's fused path: SiLU of a causal depthwise conv.

Each program walks L consecutive positions of BD channels of one sequence, keeping the last three inputs
(and, backward, the last three pre-activation gradients) in registers, so every element is read from
memory once; it takes four positions an iteration, their loads issued before any is used. fla's
causal_conv1d loads each [time, channel] tile four times shifted and runs its forward again inside its
backward: on an H200 at [64, 512, 512] bf16 (a slice of the KDA layer's packed projection, as in the
model) it takes 48 us forward and 179 us backward; these kernels with one position an iteration take
35 us and 69 us, with four 27 us and 58 us (docs/performance.md).

The window is four taps; a narrower conv runs with zero weights in front (the same function). A wider
one is refused by the caller (ops/short_conv/ `is_fused`). A conv of dilation D (the engram's) is D
undilated ones, each over the positions of one residue mod D: a program walks one residue's positions,
D apart, so the same registers carry its taps. The weight's gradient is summed in fp32
over per-program parts in a fixed order (deterministic) and returned in the weight's dtype.

Imported only where Triton is (CUDA machines; the dev set-up, whose tests run it under Triton's
interpreter): `short_conv.fused_kernels()` looks it up. The block sizes are fixed, chosen once from the
probe's sweep: no autotuning at a cold start, and two processes run the same kernels.

One launch runs n convs over adjacent channel slices of x (the KDA layer's q, k and v, each C wide, in
its packed projection), and can L2-normalise the first few of them over each head of HD channels (fla's
l2norm, eps inside the square root) before rounding: the KDA layer's q and k reach fla normalised, with
no separate norm kernel each way. A program's channels are a [G, HD] block (G whole heads), so a head's
sum is a row sum in registers; the forward stores each head's 1 / norm (fp32, [norm, B, T, C / HD]), which
the backward reads where it recomputes the rest from x.

Layouts: x [B, T, >= n·C] with unit stride over channels (a slice of a wider tensor is fine), weight
[n·C, W] fp32, y [n, B, T, C] contiguous (y[i] is conv i's output), each dy [B, T, C] contiguous, dx
shaped as x with unit stride over channels. Grid: (n · channel blocks of a conv, blocks of a residue's
positions, B · D).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

TAPS = 4
# (positions a program walks, a multiple of 4; channels; warps; pipeline stages): the fastest of a
# sweep of these four on an H200 at [64, 512, 512] bf16.
FWD_BLOCKS = (32, 128, 1, 3)
BWD_BLOCKS = (64, 128, 1, 2)
# The same with q and k L2-normalised inside (a row sum a position each way): the fastest of a sweep
# of the packed q, k, v conv on an H200 (32x256 forward on 2 warps is 17 us slower there).
NORM_FWD_BLOCKS = FWD_BLOCKS
NORM_BWD_BLOCKS = (32, 64, 1, 2)
NORM_EPS = 1e-6  # fla's l2norm's (and model/norm.py's l2norm's): x / sqrt(sum(x^2) + eps)
MAX_CONVS = 3  # the backward takes up to three gradients' pointers (q, k, v)


@triton.jit
def _load(p, t, s, m_d, n):
    """Position t's channels in fp32 (zeros outside [0, n))."""
    return tl.load(p + t.to(tl.int64) * s, mask=m_d & (t >= 0) & (t < n), other=0.0).to(tl.float32)


@triton.jit
def _act_store(p, t, s, a, m_d, n, normed, p_r, s_r, m_h, NORM: tl.constexpr, EPS: tl.constexpr):
    """SiLU(a) at position t (if in [0, n)), each head (a row of the [G, HD] block) L2-normalised where
    `normed`, its 1/norm stored for the backward."""
    y = a * tl.sigmoid(a)
    if NORM:
        r = 1 / tl.sqrt(tl.sum(y * y, 1) + EPS)
        tl.store(p_r + t.to(tl.int64) * s_r, r, mask=m_h & normed & (t < n))
        y = tl.where(normed, y * r[:, None], y)
    tl.store(p + t.to(tl.int64) * s, y.to(p.dtype.element_ty), mask=m_d & (t < n))


@triton.jit
def _block(i_d, NB: tl.constexpr, C: tl.constexpr, G: tl.constexpr, HD: tl.constexpr):
    """Program i_d's conv, its channels within that conv as a [G, HD] block and their mask, and the
    block's heads (and their mask)."""
    i_n, i_c = i_d // NB, i_d % NB
    o_c = i_c * G * HD + tl.arange(0, G)[:, None] * HD + tl.arange(0, HD)[None, :]
    o_h = i_c * G + tl.arange(0, G)
    return i_n, o_c, o_c < C, o_h, o_h < C // HD


@triton.jit
def _taps(w, o_w, m_d):
    return (
        tl.load(w + o_w, mask=m_d, other=0.0),
        tl.load(w + o_w + 1, mask=m_d, other=0.0),
        tl.load(w + o_w + 2, mask=m_d, other=0.0),
        tl.load(w + o_w + 3, mask=m_d, other=0.0),
    )


@triton.jit
def _fwd_kernel(
    x, w, y, rstd, B, T, stride_x_b, stride_x_t, C: tl.constexpr, NB: tl.constexpr, G: tl.constexpr,
    HD: tl.constexpr, L: tl.constexpr, DIL: tl.constexpr, NORM: tl.constexpr, EPS: tl.constexpr, NS: tl.constexpr,
):  # fmt: skip
    i_d, i_t, i_br = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n, o_c, m_d, o_h, m_h = _block(i_d, NB, C, G, HD)
    normed = i_n < NORM  # NORM: how many of the n convs (the first ones) are normalised
    # t below counts the positions r, r + DIL, r + 2 DIL, ... of residue r: n_r of them
    i_b, r = i_br // DIL, i_br % DIL
    n_r = (T - r + DIL - 1) // DIL
    w0, w1, w2, w3 = _taps(w, (i_n * C + o_c) * 4, m_d)
    p_x = x + i_b.to(tl.int64) * stride_x_b + r * stride_x_t + i_n * C + o_c
    p_y = y + ((i_n * B + i_b).to(tl.int64) * T + r) * C + o_c
    p_r = rstd + ((i_n * B + i_b).to(tl.int64) * T + r) * (C // HD) + o_h  # rstd [NORM, B, T, C / HD]
    s_x, s_y, s_r = stride_x_t * DIL, C * DIL, (C // HD) * DIL
    t0 = i_t * L
    # x1, x2, x3: the inputs at t - 3, t - 2, t - 1 (zeros before the sequence's start)
    x1 = _load(p_x, t0 - 3, s_x, m_d, n_r)
    x2 = _load(p_x, t0 - 2, s_x, m_d, n_r)
    x3 = _load(p_x, t0 - 1, s_x, m_d, n_r)
    # Four positions an iteration, their loads issued before any is used (four in flight, not one).
    for t in tl.range(t0, t0 + L, 4, num_stages=NS):
        xa = _load(p_x, t, s_x, m_d, n_r)
        xb = _load(p_x, t + 1, s_x, m_d, n_r)
        xc = _load(p_x, t + 2, s_x, m_d, n_r)
        xd = _load(p_x, t + 3, s_x, m_d, n_r)
        a = w0 * x1 + w1 * x2 + w2 * x3 + w3 * xa
        _act_store(p_y, t, s_y, a, m_d, n_r, normed, p_r, s_r, m_h, NORM, EPS)
        a = w0 * x2 + w1 * x3 + w2 * xa + w3 * xb
        _act_store(p_y, t + 1, s_y, a, m_d, n_r, normed, p_r, s_r, m_h, NORM, EPS)
        a = w0 * x3 + w1 * xa + w2 * xb + w3 * xc
        _act_store(p_y, t + 2, s_y, a, m_d, n_r, normed, p_r, s_r, m_h, NORM, EPS)
        a = w0 * xa + w1 * xb + w2 * xc + w3 * xd
        _act_store(p_y, t + 3, s_y, a, m_d, n_r, normed, p_r, s_r, m_h, NORM, EPS)
        x1, x2, x3 = xb, xc, xd


@triton.jit
def _da(x1, x2, x3, xt, dyt, r, w0, w1, w2, w3, normed, NORM: tl.constexpr):
    """The pre-activation's gradient at a position, a recomputed from the four inputs: through the
    head's L2 norm where `normed` (y = s·r with the forward's r = 1/sqrt(sum s^2 + eps): ds = r·(dy −
    y·sum(dy·y))), then SiLU's: ds · SiLU'(a)."""
    a = w0 * x1 + w1 * x2 + w2 * x3 + w3 * xt
    sig = tl.sigmoid(a)
    if NORM:
        yn = a * sig * r[:, None]
        dyt = tl.where(normed, (dyt - yn * tl.sum(dyt * yn, 1)[:, None]) * r[:, None], dyt)
    return dyt * sig * (1 + a * (1 - sig))


@triton.jit
def _store_dx(p, u, s, du, m_d, t0, L, n):
    """dx at position u, if u is this block's (in [t0, t0 + L)) and in the sequence."""
    tl.store(p + u.to(tl.int64) * s, du.to(p.dtype.element_ty), mask=m_d & (u >= t0) & (u < t0 + L) & (u < n))


@triton.jit
def _bwd_kernel(
    x, w, rstd, dy0, dy1, dy2, dx, dw, B, T, stride_x_b, stride_x_t, stride_dx_b, stride_dx_t, N0, N_ALL,
    C: tl.constexpr, NB: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, L: tl.constexpr, DIL: tl.constexpr,
    NORM: tl.constexpr, NS: tl.constexpr,
):  # fmt: skip
    # This launch's convs are N0, N0 + 1, ... of N_ALL (one launch per dtype of their output gradients)
    i_d, i_t, i_br = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_l, o_c, m_d, o_h, m_h = _block(i_d, NB, C, G, HD)
    i_n = i_l + N0
    normed = i_n < NORM
    dy = dy0  # conv i_n's output gradient: one of three tensors
    if i_l == 1:
        dy = dy1
    if i_l == 2:
        dy = dy2
    i_b, r = i_br // DIL, i_br % DIL  # as in _fwd_kernel
    n_r = (T - r + DIL - 1) // DIL
    w0, w1, w2, w3 = _taps(w, (i_n * C + o_c) * 4, m_d)
    p_x = x + i_b.to(tl.int64) * stride_x_b + r * stride_x_t + i_n * C + o_c
    p_dy = dy + (i_b.to(tl.int64) * T + r) * C + o_c
    p_dx = dx + i_b.to(tl.int64) * stride_dx_b + r * stride_dx_t + i_n * C + o_c
    p_r = rstd + ((i_n * B + i_b).to(tl.int64) * T + r) * (C // HD) + o_h  # as in _fwd_kernel
    s_x, s_dy, s_dx, s_r = stride_x_t * DIL, C * DIL, stride_dx_t * DIL, (C // HD) * DIL
    m_r = m_h & normed
    t0 = i_t * L
    x1 = _load(p_x, t0 - 3, s_x, m_d, n_r)
    x2 = _load(p_x, t0 - 2, s_x, m_d, n_r)
    x3 = _load(p_x, t0 - 1, s_x, m_d, n_r)
    # d1, d2, d3: the pre-activation's gradient at t - 1, t - 2, t - 3; g0..g3: this program's part of dw
    d1 = tl.zeros((G, HD), dtype=tl.float32)
    d2 = tl.zeros((G, HD), dtype=tl.float32)
    d3 = tl.zeros((G, HD), dtype=tl.float32)
    g0 = tl.zeros((G, HD), dtype=tl.float32)
    g1 = tl.zeros((G, HD), dtype=tl.float32)
    g2 = tl.zeros((G, HD), dtype=tl.float32)
    g3 = tl.zeros((G, HD), dtype=tl.float32)
    r0 = tl.zeros((G,), dtype=tl.float32)  # the heads' 1/norm where not normalised (unused)
    # dx[u] needs da[u .. u + 3]: walk the positions t0 .. t0 + L + 3 (one more, masked), four an
    # iteration as in _fwd_kernel, and write dx three positions behind.
    for t in tl.range(t0, t0 + L + 4, 4, num_stages=NS):
        xa = _load(p_x, t, s_x, m_d, n_r)
        xb = _load(p_x, t + 1, s_x, m_d, n_r)
        xc = _load(p_x, t + 2, s_x, m_d, n_r)
        xd = _load(p_x, t + 3, s_x, m_d, n_r)
        ya = _load(p_dy, t, s_dy, m_d, n_r)
        yb = _load(p_dy, t + 1, s_dy, m_d, n_r)
        yc = _load(p_dy, t + 2, s_dy, m_d, n_r)
        yd = _load(p_dy, t + 3, s_dy, m_d, n_r)
        ra, rb, rc, rd = r0, r0, r0, r0
        if NORM:
            ra = _load(p_r, t, s_r, m_r, n_r)
            rb = _load(p_r, t + 1, s_r, m_r, n_r)
            rc = _load(p_r, t + 2, s_r, m_r, n_r)
            rd = _load(p_r, t + 3, s_r, m_r, n_r)
        da = _da(x1, x2, x3, xa, ya, ra, w0, w1, w2, w3, normed, NORM)
        db = _da(x2, x3, xa, xb, yb, rb, w0, w1, w2, w3, normed, NORM)
        dc = _da(x3, xa, xb, xc, yc, rc, w0, w1, w2, w3, normed, NORM)
        dd = _da(xa, xb, xc, xd, yd, rd, w0, w1, w2, w3, normed, NORM)
        _store_dx(p_dx, t - 3, s_dx, w0 * da + w1 * d1 + w2 * d2 + w3 * d3, m_d, t0, L, n_r)
        _store_dx(p_dx, t - 2, s_dx, w0 * db + w1 * da + w2 * d1 + w3 * d2, m_d, t0, L, n_r)
        _store_dx(p_dx, t - 1, s_dx, w0 * dc + w1 * db + w2 * da + w3 * d1, m_d, t0, L, n_r)
        _store_dx(p_dx, t, s_dx, w0 * dd + w1 * dc + w2 * db + w3 * da, m_d, t0, L, n_r)
        # dw from this block's positions only (those from t0 + L on are the next block's)
        oa = tl.where(t < t0 + L, da, 0.0)
        ob = tl.where(t + 1 < t0 + L, db, 0.0)
        oc = tl.where(t + 2 < t0 + L, dc, 0.0)
        od = tl.where(t + 3 < t0 + L, dd, 0.0)
        g0 += oa * x1 + ob * x2 + oc * x3 + od * xa
        g1 += oa * x2 + ob * x3 + oc * xa + od * xb
        g2 += oa * x3 + ob * xa + oc * xb + od * xc
        g3 += oa * xa + ob * xb + oc * xc + od * xd
        x1, x2, x3 = xb, xc, xd
        d3, d2, d1 = db, dc, dd
    # parts [programs over positions, n·C, 4]: this program's row, its conv's channels
    p_dw = dw + ((i_br * tl.num_programs(1) + i_t).to(tl.int64) * N_ALL * C + i_n * C + o_c) * 4
    tl.store(p_dw, g0, mask=m_d)
    tl.store(p_dw + 1, g1, mask=m_d)
    tl.store(p_dw + 2, g2, mask=m_d)
    tl.store(p_dw + 3, g3, mask=m_d)


def _taps_of(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, W <= 4] as [N, 4] fp32, zeros in front: the same causal conv (no copy when it is already)."""
    assert weight.shape[1] <= TAPS, weight.shape
    w = weight.float()
    return (F.pad(w, (TAPS - weight.shape[1], 0)) if weight.shape[1] < TAPS else w).contiguous()


def _layout(x: torch.Tensor, weight: torch.Tensor, n: int, norm: int, head: int, BD: int, L: int, dilation: int):
    """(C, the [G, HD] channel block, blocks per conv, grid) of n convs over x's first n·C channels."""
    B, T, N = x.shape
    C = weight.shape[0] // n
    assert 1 <= n <= MAX_CONVS and weight.shape[0] == n * C and N >= n * C and x.stride(-1) == 1, (
        x.shape,
        weight.shape,
    )
    assert 0 <= norm <= n and (norm == 0 or (head > 0 and head & (head - 1) == 0 and C % head == 0)), (norm, head, C)
    G, HD = (max(1, BD // head), head) if norm else (1, BD)
    NB = triton.cdiv(C, G * HD)
    return C, G, HD, NB, (n * NB, triton.cdiv(triton.cdiv(T, dilation), L), B * dilation)


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    n: int = 1,
    dilation: int = 1,
    norm: int = 0,
    head: int = 0,
    blocks: tuple[int, int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SiLU(causal depthwise conv i of x's channels [i·C, (i+1)·C) with weight[i·C:(i+1)·C], taps `dilation`
    apart) for i < n, the first `norm` of them L2-normalised over each `head` channels: (y [n, B, T, C] in
    x's dtype, contiguous; the normalised heads' 1 / norm [norm, B, T, C / head] fp32 for `backward`, or
    None without `norm`)."""
    B, T, _ = x.shape
    L, BD, num_warps, stages = blocks or (NORM_FWD_BLOCKS if norm else FWD_BLOCKS)
    C, G, HD, NB, grid = _layout(x, weight, n, norm, head, BD, L, dilation)
    y = torch.empty(n, B, T, C, dtype=x.dtype, device=x.device)
    rstd = torch.empty(norm, B, T, C // HD, dtype=torch.float32, device=x.device) if norm else None
    _fwd_kernel[grid](
        x, _taps_of(weight), y, y if rstd is None else rstd, B, T, x.stride(0), x.stride(1), C=C, NB=NB, G=G, HD=HD,
        L=L, DIL=dilation, NORM=norm, EPS=NORM_EPS, NS=stages, num_warps=num_warps,
    )  # fmt: skip
    return y, rstd


def backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    dys: tuple[torch.Tensor, ...],
    dx: torch.Tensor,
    dilation: int = 1,
    norm: int = 0,
    head: int = 0,
    rstd: torch.Tensor | None = None,
    blocks: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """`forward`'s backward for the output gradients `dys` (one [B, T, C] per conv, in any float dtype:
    one launch per run of one dtype) and, with `norm`, the forward's `rstd`: writes the input's gradient
    into dx[..., :n·C] (dx shaped as x, unit stride over channels); returns the weight's [n·C, W]."""
    n = len(dys)
    B, T, _ = x.shape
    L, BD, num_warps, stages = blocks or (NORM_BWD_BLOCKS if norm else BWD_BLOCKS)
    C, G, HD, NB, grid = _layout(x, weight, n, norm, head, BD, L, dilation)
    assert all(dy.is_contiguous() and dy.shape == (B, T, C) for dy in dys) and dx.stride(-1) == 1, dx.stride()
    assert dx.shape == x.shape, (dx.shape, x.shape)
    assert (rstd is not None) == bool(norm) and (rstd is None or rstd.shape == (norm, B, T, C // HD)), norm
    parts = torch.empty(grid[2] * grid[1], n * C, TAPS, dtype=torch.float32, device=x.device)
    taps = _taps_of(weight)
    for n0, run in _dtype_runs(dys):
        dy0, dy1, dy2 = (*run, *run[:1] * (MAX_CONVS - len(run)))
        _bwd_kernel[(len(run) * NB, *grid[1:])](
            x, taps, dx if rstd is None else rstd, dy0, dy1, dy2, dx, parts, B, T, x.stride(0), x.stride(1),
            dx.stride(0), dx.stride(1), n0, n, C=C, NB=NB, G=G, HD=HD, L=L, DIL=dilation, NORM=norm, NS=stages,
            num_warps=num_warps,
        )  # fmt: skip
    return parts.sum(0)[:, TAPS - weight.shape[1] :].to(weight.dtype)


def _dtype_runs(dys: tuple[torch.Tensor, ...]) -> list[tuple[int, tuple[torch.Tensor, ...]]]:
    """`dys` cut into runs of one dtype, each with the index of its first: a kernel's pointer to one of
    its three gradients is chosen at run time, so the three must share an element type."""
    runs: list[tuple[int, tuple[torch.Tensor, ...]]] = []
    for i, dy in enumerate(dys):
        if runs and runs[-1][1][0].dtype == dy.dtype:
            runs[-1] = (runs[-1][0], (*runs[-1][1], dy))
        else:
            runs.append((i, (dy,)))
    return runs
