"""Probe NesterovSinkhorn's SR-Sinkhorn on a GPU: torch's batched form (train/optim.py's
`sr_sinkhorn_torch`: per half-iteration a norm, a clamp, a division and a product, ~280 small kernels a
`small` step) against dormouse's Triton kernels (train/sinkhorn_kernels.py, three an iteration: what
`sr_sinkhorn` runs on CUDA). Prints, per stacked shape group of the preset's matrices and in total, the
kernels' error against torch's (fp32, other reduction orders) and both medians in CUDA-graph replays, as
the graphed update runs them. Session 18, call 1 (the kernels as a candidate here, before they were
wired in): torch 1249 us, the kernels 407 us a `small` step (`h200-session18/sinkhorn-probe.log`).

    python benches/sinkhorn_probe.py [--preset small --iters 5]
"""

import argparse
import collections
import functools

import torch
import triton.testing

from dormouse import config
from dormouse.model.model import DormouseLM
from dormouse.train.optim import sr_sinkhorn, sr_sinkhorn_torch
from dormouse.train.routing import route


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
        ref, got = sr_sinkhorn_torch(u, args.iters, 1e-12), sr_sinkhorn(u, args.iters)
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        times = {"torch": bench(lambda u=u: sr_sinkhorn_torch(u, args.iters, 1e-12))}
        times["triton"] = bench(lambda u=u: sr_sinkhorn(u, args.iters))
        for name in total:
            total[name] += times[name]
        print(
            f"[{count}, {m}, {n}]: torch {times['torch'] * 1e3:7.1f} us, triton {times['triton'] * 1e3:7.1f} us; "
            f"triton vs torch max|d|/max|ref| {err:.1e}"
        )
    print(f"all groups: torch {total['torch'] * 1e3:.1f} us, triton {total['triton'] * 1e3:.1f} us a step")


if __name__ == "__main__":
    main()
