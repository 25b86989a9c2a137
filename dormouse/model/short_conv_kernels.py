"""dormouse's own Triton kernels for the short conv's fused path: SiLU of a causal depthwise conv.

Each program walks L consecutive positions of BD channels of one sequence, keeping the last three inputs
(and, backward, the last three pre-activation gradients) in registers, so every element is read from
memory once; it takes four positions an iteration, their loads issued before any is used. fla's
causal_conv1d, which the fused path ran before, loads each [time, channel] tile four times shifted and
runs its forward again inside its backward: on the H200 at [64, 512, 512] bf16 (a slice of the KDA
layer's packed projection, as in the model) it took 48 us forward and 179 us backward; one position an
iteration took 35 us and 69 us, four take 27 us and 58 us (benches/conv_probe.py; session 19 call 4
ran those kernels as benches/conv_unroll_probe.py at a4c1dc9; docs/performance.md).

The window is four taps; a narrower conv runs with zero weights in front (the same function). A wider
one is refused by the caller (short_conv.check_fused_width). A conv of dilation D (the engram's) is D
undilated ones, each over the positions of one residue mod D: a program walks one residue's positions,
D apart, so the same registers carry its taps. The weight's gradient is summed in fp32
over per-program parts in a fixed order (deterministic) and returned in the weight's dtype.

Imported only where Triton is (CUDA machines): `short_conv.fused_kernels()` looks it up. The block
sizes are fixed, chosen once from the probe's sweep: no autotuning at a cold start, and two processes
run the same kernels.

Layouts: x [B, T, C] with unit stride over C (a slice of a wider tensor is fine), weight [C, W] fp32,
dy [B, T, C] contiguous, y contiguous, dx [B, T, C] with unit stride over C. Grid: (channel blocks,
blocks of a residue's positions, B · D).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

TAPS = 4
# (positions a program walks, a multiple of 4; channels; warps; pipeline stages): the fastest of
# the sweep of session 19's call 4 (benches/conv_probe.py's blocks; run as conv_unroll_probe.py at a4c1dc9).
FWD_BLOCKS = (32, 128, 1, 3)
BWD_BLOCKS = (64, 128, 1, 2)


@triton.jit
def _load(p, t, s, m_d, n):
    """Position t's BD channels in fp32 (zeros outside [0, n))."""
    return tl.load(p + t.to(tl.int64) * s, mask=m_d & (t >= 0) & (t < n), other=0.0).to(tl.float32)


@triton.jit
def _silu_store(p, t, s, a, m):
    tl.store(p + t.to(tl.int64) * s, (a * tl.sigmoid(a)).to(p.dtype.element_ty), mask=m)


@triton.jit
def _fwd_kernel(
    x, w, y, T, stride_x_b, stride_x_t, C: tl.constexpr, L: tl.constexpr, BD: tl.constexpr, DIL: tl.constexpr,
    NS: tl.constexpr,
):  # fmt: skip
    i_d, i_t, i_br = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # t below counts the positions r, r + DIL, r + 2 DIL, ... of residue r: n_r of them
    i_b, r = i_br // DIL, i_br % DIL
    n_r = (T - r + DIL - 1) // DIL
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < C
    w0 = tl.load(w + o_d * 4, mask=m_d, other=0.0)
    w1 = tl.load(w + o_d * 4 + 1, mask=m_d, other=0.0)
    w2 = tl.load(w + o_d * 4 + 2, mask=m_d, other=0.0)
    w3 = tl.load(w + o_d * 4 + 3, mask=m_d, other=0.0)
    p_x = x + i_b.to(tl.int64) * stride_x_b + r * stride_x_t + o_d
    p_y = y + (i_b.to(tl.int64) * T + r) * C + o_d
    s_x, s_y = stride_x_t * DIL, C * DIL
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
        _silu_store(p_y, t, s_y, w0 * x1 + w1 * x2 + w2 * x3 + w3 * xa, m_d & (t < n_r))
        _silu_store(p_y, t + 1, s_y, w0 * x2 + w1 * x3 + w2 * xa + w3 * xb, m_d & (t + 1 < n_r))
        _silu_store(p_y, t + 2, s_y, w0 * x3 + w1 * xa + w2 * xb + w3 * xc, m_d & (t + 2 < n_r))
        _silu_store(p_y, t + 3, s_y, w0 * xa + w1 * xb + w2 * xc + w3 * xd, m_d & (t + 3 < n_r))
        x1, x2, x3 = xb, xc, xd


@triton.jit
def _da(x1, x2, x3, xt, dyt, w0, w1, w2, w3):
    """The pre-activation's gradient at a position: dy · SiLU'(a), a recomputed from the four inputs."""
    a = w0 * x1 + w1 * x2 + w2 * x3 + w3 * xt
    sig = tl.sigmoid(a)
    return dyt * sig * (1 + a * (1 - sig))


@triton.jit
def _store_dx(p, u, s, du, m_d, t0, L, n):
    """dx at position u, if u is this block's (in [t0, t0 + L)) and in the sequence."""
    tl.store(p + u.to(tl.int64) * s, du.to(p.dtype.element_ty), mask=m_d & (u >= t0) & (u < t0 + L) & (u < n))


@triton.jit
def _bwd_kernel(
    x, w, dy, dx, dw, T, stride_x_b, stride_x_t, stride_dx_b, stride_dx_t, C: tl.constexpr, L: tl.constexpr,
    BD: tl.constexpr, DIL: tl.constexpr, NS: tl.constexpr,
):  # fmt: skip
    i_d, i_t, i_br = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, r = i_br // DIL, i_br % DIL  # as in _fwd_kernel
    n_r = (T - r + DIL - 1) // DIL
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < C
    w0 = tl.load(w + o_d * 4, mask=m_d, other=0.0)
    w1 = tl.load(w + o_d * 4 + 1, mask=m_d, other=0.0)
    w2 = tl.load(w + o_d * 4 + 2, mask=m_d, other=0.0)
    w3 = tl.load(w + o_d * 4 + 3, mask=m_d, other=0.0)
    p_x = x + i_b.to(tl.int64) * stride_x_b + r * stride_x_t + o_d
    p_dy = dy + (i_b.to(tl.int64) * T + r) * C + o_d
    p_dx = dx + i_b.to(tl.int64) * stride_dx_b + r * stride_dx_t + o_d
    s_x, s_dy, s_dx = stride_x_t * DIL, C * DIL, stride_dx_t * DIL
    t0 = i_t * L
    x1 = _load(p_x, t0 - 3, s_x, m_d, n_r)
    x2 = _load(p_x, t0 - 2, s_x, m_d, n_r)
    x3 = _load(p_x, t0 - 1, s_x, m_d, n_r)
    # d1, d2, d3: the pre-activation's gradient at t - 1, t - 2, t - 3; g0..g3: this program's part of dw
    d1 = tl.zeros((BD,), dtype=tl.float32)
    d2 = tl.zeros((BD,), dtype=tl.float32)
    d3 = tl.zeros((BD,), dtype=tl.float32)
    g0 = tl.zeros((BD,), dtype=tl.float32)
    g1 = tl.zeros((BD,), dtype=tl.float32)
    g2 = tl.zeros((BD,), dtype=tl.float32)
    g3 = tl.zeros((BD,), dtype=tl.float32)
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
        da = _da(x1, x2, x3, xa, ya, w0, w1, w2, w3)
        db = _da(x2, x3, xa, xb, yb, w0, w1, w2, w3)
        dc = _da(x3, xa, xb, xc, yc, w0, w1, w2, w3)
        dd = _da(xa, xb, xc, xd, yd, w0, w1, w2, w3)
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
    p_dw = dw + (i_br * tl.num_programs(1) + i_t).to(tl.int64) * C * 4 + o_d * 4
    tl.store(p_dw, g0, mask=m_d)
    tl.store(p_dw + 1, g1, mask=m_d)
    tl.store(p_dw + 2, g2, mask=m_d)
    tl.store(p_dw + 3, g3, mask=m_d)


def _taps(weight: torch.Tensor) -> torch.Tensor:
    """weight [C, W <= 4] as [C, 4] fp32, zeros in front: the same causal conv."""
    assert weight.shape[1] <= TAPS, weight.shape
    return F.pad(weight.float(), (TAPS - weight.shape[1], 0)).contiguous()


def _grid(x: torch.Tensor, L: int, BD: int, dilation: int) -> tuple[int, int, int]:
    B, T, C = x.shape
    return triton.cdiv(C, BD), triton.cdiv(triton.cdiv(T, dilation), L), B * dilation


def forward(
    x: torch.Tensor, weight: torch.Tensor, dilation: int = 1, blocks: tuple[int, int, int, int] = FWD_BLOCKS
) -> torch.Tensor:
    """SiLU(causal depthwise conv of x [B, T, C] with weight [C, W], taps `dilation` apart), contiguous
    [B, T, C] in x's dtype."""
    B, T, C = x.shape
    assert x.stride(-1) == 1 and weight.shape[0] == C, (x.stride(), weight.shape)
    L, BD, num_warps, stages = blocks
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    _fwd_kernel[_grid(x, L, BD, dilation)](
        x, _taps(weight), y, T, x.stride(0), x.stride(1), C=C, L=L, BD=BD, DIL=dilation, NS=stages,
        num_warps=num_warps,
    )  # fmt: skip
    return y


def backward(
    x: torch.Tensor,
    weight: torch.Tensor,
    dy: torch.Tensor,
    dx: torch.Tensor,
    dilation: int = 1,
    blocks: tuple[int, int, int, int] = BWD_BLOCKS,
) -> torch.Tensor:
    """Writes the input's gradient into `dx` (x's shape, unit stride over C); returns the weight's [C, W]."""
    B, T, C = x.shape
    assert dy.is_contiguous() and dx.stride(-1) == 1 and dx.shape == x.shape, (dy.stride(), dx.stride())
    L, BD, num_warps, stages = blocks
    grid = _grid(x, L, BD, dilation)
    parts = torch.empty(grid[2] * grid[1], C, TAPS, dtype=torch.float32, device=x.device)
    _bwd_kernel[grid](
        x, _taps(weight), dy, dx, parts, T, x.stride(0), x.stride(1), dx.stride(0), dx.stride(1), C=C, L=L, BD=BD,
        DIL=dilation, NS=stages, num_warps=num_warps,
    )  # fmt: skip
    return parts.sum(0)[:, TAPS - weight.shape[1] :].to(weight.dtype)
