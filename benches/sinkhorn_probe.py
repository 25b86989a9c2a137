"""Probe NesterovSinkhorn's SR-Sinkhorn on a GPU: torch's batched form (train/optim.py: per half-iteration
a norm, a clamp, a division and a product, ~280 small kernels a `small` step, ~1.5 ms by session 17's
profile) against a Triton candidate of three kernels an iteration (each row normalised by one program;
each column's sum of squares taken in row blocks, then summed in a fixed order and applied). Prints, per
stacked shape group of the preset's matrices and in total, the candidate's error against torch's (fp32,
other reduction orders) and both medians in CUDA-graph replays, as the graphed update runs them.
Measures; changes nothing: the optimizer keeps torch's form until this says the candidate is worth it.
Written in session 17 without a GPU left: not run yet (benches/sessions/next-h200-sinkhorn.sh runs it).

    python benches/sinkhorn_probe.py [--preset small --iters 5]
"""

import argparse
import collections
import functools
import math

import torch
import triton
import triton.language as tl
import triton.testing

from dormouse import config
from dormouse.model.model import DormouseLM
from dormouse.train.optim import sr_sinkhorn
from dormouse.train.routing import route

ROW_BLOCKS = 64  # rows a column-sum program takes: [N, m / 64, n] partial sums
TILE = (32, 64)  # (rows, columns) a column-scaling program rescales


@triton.jit
def _rows_kernel(src, dst, n, target, eps, BLOCK: tl.constexpr):
    """dst row = src row · target / max(‖src row‖, eps); one program a row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(src + row * n + cols, mask=m, other=0.0)
    scale = target / tl.maximum(tl.sqrt(tl.sum(x * x, axis=0)), eps)
    tl.store(dst + row * n + cols, x * scale, mask=m)


@triton.jit
def _column_sums_kernel(x, part, m, n, RB: tl.constexpr, BC: tl.constexpr):
    """part[mat, row block, col] = Σ x² over RB rows of the block."""
    mat, i_c, i_r = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    cols = i_c * BC + tl.arange(0, BC)
    rows = i_r * RB + tl.arange(0, RB)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    v = tl.load(x + mat * m * n + rows[:, None] * n + cols[None, :], mask=mask, other=0.0)
    blocks = tl.cdiv(m, RB)
    tl.store(part + (mat * blocks + i_r) * n + cols, tl.sum(v * v, axis=0), mask=cols < n)


@triton.jit
def _columns_kernel(
    x, part, m, n, target, eps, RB: tl.constexpr, BLOCKS: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr
):
    """x column ·= target / max(‖column‖, eps), the norm from the row blocks' parts summed in order."""
    mat, i_c, i_r = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    cols = i_c * BC + tl.arange(0, BC)
    blocks = tl.arange(0, BLOCKS)
    count = tl.cdiv(m, RB)
    ss = tl.load(
        part + (mat * count + blocks[:, None]) * n + cols[None, :],
        mask=(blocks[:, None] < count) & (cols[None, :] < n),
        other=0.0,
    )
    scale = target / tl.maximum(tl.sqrt(tl.sum(ss, axis=0)), eps)
    rows = i_r * BR + tl.arange(0, BR)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    p = x + mat * m * n + rows[:, None] * n + cols[None, :]
    tl.store(p, tl.load(p, mask=mask, other=0.0) * scale[None, :], mask=mask)


def sr_sinkhorn_triton(u: torch.Tensor, iters: int, eps: float = 1e-12) -> torch.Tensor:
    """train/optim.py's sr_sinkhorn of a contiguous fp32 stack u [N, m, n] (u itself is not changed)."""
    N, m, n = u.shape
    x = torch.empty_like(u)
    blocks = triton.cdiv(m, ROW_BLOCKS)
    part = torch.empty(N, blocks, n, dtype=torch.float32, device=u.device)
    BR, BC = TILE
    src = u
    for _ in range(iters):
        _rows_kernel[(N * m,)](src, x, n, math.sqrt(n), eps, BLOCK=triton.next_power_of_2(n))
        _column_sums_kernel[(N, triton.cdiv(n, BC), blocks)](x, part, m, n, RB=ROW_BLOCKS, BC=BC)
        grid = (N, triton.cdiv(n, BC), triton.cdiv(m, BR))
        scale = (math.sqrt(m), eps)
        _columns_kernel[grid](x, part, m, n, *scale, RB=ROW_BLOCKS, BLOCKS=triton.next_power_of_2(blocks), BR=BR, BC=BC)
        src = x
    return x


def shape_groups(preset: str) -> dict[tuple[int, int], int]:
    """(m, n) -> how many of the preset's NesterovSinkhorn matrices have that shape (one stack each)."""
    cfg = config.resolve(config.build(preset, {"train": {"device": "cpu"}}))
    groups = {g.name: g for g in route(DormouseLM(cfg.model, seed=0))}
    return dict(collections.Counter(tuple(p.shape) for _, p in groups["matrices"].params))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    bench = functools.partial(triton.testing.do_bench_cudagraph, rep=50, return_mode="median")
    total = {"torch": 0.0, "triton": 0.0}
    for (m, n), count in sorted(shape_groups(args.preset).items()):
        u = torch.randn(count, m, n, generator=torch.Generator().manual_seed(m * n)).cuda()
        ref, got = sr_sinkhorn(u, args.iters), sr_sinkhorn_triton(u, args.iters)
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        times = {"torch": bench(lambda u=u: sr_sinkhorn(u, args.iters))}
        times["triton"] = bench(lambda u=u: sr_sinkhorn_triton(u, args.iters))
        for name in total:
            total[name] += times[name]
        print(
            f"[{count}, {m}, {n}]: torch {times['torch'] * 1e3:7.1f} us, triton {times['triton'] * 1e3:7.1f} us; "
            f"triton vs torch max|d|/max|ref| {err:.1e}"
        )
    print(f"all groups: torch {total['torch'] * 1e3:.1f} us, triton {total['triton'] * 1e3:.1f} us a step")


if __name__ == "__main__":
    main()
