"""Probe: SwiGLU over the packed gate-up projection by dormouse's 2-D tiled kernels (model/swiglu_kernels.py,
a sweep of tiles) against fla's kernels, which the model ran until session 19, at the `small` B 64 shape.
Measures; changes nothing.

Why: fla's kernels walk the tensor as one flat index (row = i // D, column = i % D), so the compiler cannot
prove a block's elements contiguous; at [32768, 1536] bf16 halves of a [32768, 3072] projection they move
~2.9 TB/s forward (102 us) and ~2.8 backward (176 us) where the card copies at 4.2 (session 19's
profiles: 8 calls of each a step). Tiles of rows × columns keep each row's columns contiguous. The
arithmetic is fla's, term for term, so the outputs are its bits (checked per tile). Session 19's call 9
ran it with these kernels written inline (at 22b462f); the model's tile was the fastest.

    python benches/swiglu_probe.py [--rows 32768 --hidden 1536]
"""

import argparse
import functools

import torch
import triton

from dormouse.model import fla_kernels, swiglu_kernels

COPY_TBPS = 4.2


def forward(h, blocks):
    """model/swiglu_kernels.py's forward kernel on the packed h [N, 2H] with the tile `blocks`."""
    N, H = h.shape[0], h.shape[1] // 2
    BR, BH, warps = blocks
    z = torch.empty(N, H, dtype=h.dtype, device=h.device)
    grid = (triton.cdiv(N, BR), triton.cdiv(H, BH))
    swiglu_kernels._fwd_kernel[grid](h, h[:, H:], z, N, 2 * H, 2 * H, H=H, BR=BR, BH=BH, num_warps=warps)
    return z


def backward(h, g, blocks):
    N, H = h.shape[0], h.shape[1] // 2
    BR, BH, warps = blocks
    dh = torch.empty_like(h)
    grid = (triton.cdiv(N, BR), triton.cdiv(H, BH))
    swiglu_kernels._bwd_kernel[grid](
        h, h[:, H:], g, dh, dh[:, H:], N, 2 * H, 2 * H, H, 2 * H, 2 * H, H=H, BR=BR, BH=BH, num_warps=warps
    )
    return dh


def fla_forward(ops, h):
    gate, up = h.chunk(2, dim=-1)
    gate, gs = ops.prepare_input(gate)
    up, us = ops.prepare_input(up)
    z = torch.empty(gate.shape, dtype=h.dtype, device=h.device)
    n, d = gate.numel(), gate.shape[-1]
    ops.swiglu_fwd_kernel[lambda meta: (-(-n // meta["B"]),)](
        x=gate, y=up, z=z, stride_x_row=gs, stride_y_row=us, stride_z_row=d, T=n, D=d
    )
    return z


def fla_backward(ops, h, g):
    gate, up = h.chunk(2, dim=-1)
    gate, gs = ops.prepare_input(gate)
    up, us = ops.prepare_input(up)
    dh = torch.empty_like(h)
    d_gate, d_up = dh.chunk(2, dim=-1)
    n, d = gate.numel(), gate.shape[-1]
    ops.swiglu_fwdbwd_kernel[lambda meta: (-(-n // meta["B"]),)](
        x=gate, y=up, g=g, dx=d_gate, dy=d_up, z=None, stride_x_row=gs, stride_y_row=us, stride_g_row=d,
        stride_dx_row=2 * d, stride_dy_row=2 * d, stride_z_row=0, T=n, D=d,
    )  # fmt: skip
    return dh


def median_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64 * 512)
    ap.add_argument("--hidden", type=int, default=1536)
    args = ap.parse_args()
    N, H = args.rows, args.hidden
    n = N * H * 2
    floor = {"fwd": 3 * n / COPY_TBPS / 1e6, "bwd": 5 * n / COPY_TBPS / 1e6}
    print(f"[{N}, 2 x {H}] bf16; floors at {COPY_TBPS} TB/s: fwd {floor['fwd']:.1f} us, bwd {floor['bwd']:.1f} us")
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(N, 2 * H, generator=gen).to(torch.bfloat16).cuda()
    g = torch.randn(N, H, generator=gen).to(torch.bfloat16).cuda()
    ops = fla_kernels.swiglu()[0]
    z_fla, dh_fla = fla_forward(ops, h), fla_backward(ops, h, g)
    f = median_us(functools.partial(fla_forward, ops, h))
    b = median_us(functools.partial(fla_backward, ops, h, g))
    print(f"fla (pinned choice): fwd {f:6.1f} us ({floor['fwd'] / f * COPY_TBPS:.2f} TB/s), bwd {b:6.1f} us")
    for blocks in (
        (4, 512, 4), (8, 512, 4), (8, 512, 8), (16, 512, 8), (2, 1024, 4), (4, 1024, 8), (16, 256, 4),
        (32, 256, 8), (8, 256, 4), (1, 2048, 8), (2, 512, 2), (4, 256, 2),
    ):  # fmt: skip
        z, dh = forward(h, blocks), backward(h, g, blocks)
        same = f"fla's bits: z {torch.equal(z, z_fla)}, dh {torch.equal(dh, dh_fla)}"
        f = median_us(functools.partial(forward, h, blocks))
        b = median_us(functools.partial(backward, h, g, blocks))
        print(
            f"tiled rows, cols, warps {blocks}: fwd {f:6.1f} us ({floor['fwd'] / f * COPY_TBPS:.2f} TB/s), "
            f"bwd {b:6.1f} us ({floor['bwd'] / b * COPY_TBPS:.2f} TB/s); {same}"
        )


if __name__ == "__main__":
    main()
