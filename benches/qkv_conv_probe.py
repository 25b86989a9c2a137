"""Probe the KDA layer's q, k, v short convs on a GPU at the model's shape: one launch over the three
slices with q and k L2-normalised inside it (model/short_conv_kernels.py, a sweep of block sizes) against
what it replaced, three launches and fla's l2norm kernels on q and k (forward; backward: fla's l2norm
backward, which also rounds fla's fp32 dq and dk to bf16). Prints median times of CUDA-graph replays.
Measures; changes nothing.

    python benches/qkv_conv_probe.py [--batch 64 --seq-len 512 --channels 512 --head 64 --packed 1672]
"""

import argparse
import functools

import torch
from conv_probe import median_ms

from dormouse.model import short_conv_kernels as kernels

# (positions, channels, warps, stages); session 21's calls 2 and 3 swept more (2-4 warps, 256 channels: slower)
FWD = ((32, 128, 1, 3), (16, 128, 1, 3), (32, 64, 1, 3), (32, 256, 2, 3))
BWD = ((64, 128, 1, 2), (64, 64, 1, 2), (32, 64, 1, 2), (16, 64, 1, 2), (128, 128, 2, 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--channels", type=int, default=512)
    ap.add_argument("--head", type=int, default=64)
    ap.add_argument("--packed", type=int, default=1672, help="width of the projection q, k, v are slices of")
    args = ap.parse_args()
    B, T, C, D = args.batch, args.seq_len, args.channels, args.head
    from fla.modules.l2norm import l2norm_bwd, l2norm_fwd

    gen = torch.Generator().manual_seed(0)
    packed = torch.randn(B, T, args.packed, generator=gen).to(torch.bfloat16).cuda()
    w = (0.5 * torch.randn(3 * C, 4, generator=gen)).cuda()
    dys = tuple(torch.randn(B, T, C, generator=gen).to(torch.bfloat16).cuda() for _ in range(3))
    dq32 = torch.randn(B, T, C, generator=gen).cuda()  # fla's dq, dk come out in fp32
    dx = torch.empty_like(packed)

    def three_fwd():
        return [kernels.forward(packed[..., i * C : (i + 1) * C], w[i * C : (i + 1) * C]) for i in range(3)]

    def three_bwd():
        for i in range(3):
            part = slice(i * C, (i + 1) * C)
            kernels.backward(packed[..., part], w[part], (dys[i],), dx[..., part])

    def before_fwd():
        return [l2norm_fwd(y.view(B, T, -1, D)) for (y, _) in three_fwd()[:2]]

    (qn, q_rstd), (kn, k_rstd) = before_fwd()

    def before_bwd():
        for q, rstd in ((qn, q_rstd), (kn, k_rstd)):
            l2norm_bwd(q, rstd, dq32.view(B, T, -1, D))
        three_bwd()

    def cast():  # what fla's backward does to dq and dk without its in-kernel norm
        return dq32.to(torch.bfloat16), dq32.to(torch.bfloat16)

    print(f"[B {B}, T {T}, 3 x C {C}] bf16 in a [.., {args.packed}] projection, heads of {D}; medians of graph replays")
    print(
        f"before: 3 conv launches + fla l2norm on q, k: fwd {median_ms(before_fwd) * 1e3:6.1f} us, "
        f"bwd {median_ms(before_bwd) * 1e3:6.1f} us (fla's l2norm bwd includes the bf16 rounding of dq, dk)"
    )
    print(f"no norm: 3 launches fwd {median_ms(three_fwd) * 1e3:6.1f} us, bwd {median_ms(three_bwd) * 1e3:6.1f} us")
    one_fwd = functools.partial(kernels.forward, packed, w, 3)
    one_bwd = functools.partial(kernels.backward, packed, w, dys, dx)
    print(f"no norm: 1 launch fwd {median_ms(one_fwd) * 1e3:6.1f} us, bwd {median_ms(one_bwd) * 1e3:6.1f} us")
    print(f"fla's dq, dk rounded to bf16 without its norm (the cast in its backward): {median_ms(cast) * 1e3:6.1f} us")
    _, rstd = kernels.forward(packed, w, 3, 1, 2, D)
    for blocks in FWD:
        f = median_ms(functools.partial(kernels.forward, packed, w, 3, 1, 2, D, blocks=blocks))
        mark = "  <- chosen" if blocks == kernels.NORM_FWD_BLOCKS else ""
        print(f"one launch, q k normalised, fwd L, BD, warps, stages {blocks}: {f * 1e3:6.1f} us{mark}")
    for blocks in BWD:
        b = median_ms(functools.partial(kernels.backward, packed, w, dys, dx, 1, 2, D, rstd, blocks=blocks))
        mark = "  <- chosen" if blocks == kernels.NORM_BWD_BLOCKS else ""
        print(f"one launch, q k normalised, bwd L, BD, warps, stages {blocks}: {b * 1e3:6.1f} us{mark}")


if __name__ == "__main__":
    main()
