"""Probe NesterovSinkhorn's SR-Sinkhorn on a GPU: torch's batched form (train/optim.py's
`sr_sinkhorn_torch`: per half-iteration a norm, a clamp, a division and a product, ~280 small kernels a
`small` step) against dormouse's Triton kernels (train/sinkhorn_kernels.py, three an iteration: what
`sr_sinkhorn` runs on CUDA). Prints, per stacked shape group of the preset's matrices and in total, the
kernels' error against torch's (fp32, other reduction orders) and both medians in CUDA-graph replays, as
the graphed update runs them. Session 18, call 1 (the kernels as a candidate here, before they were
wired in): torch 1249 us, the kernels 407 us a `small` step (`h200-session18/sinkhorn-probe.log`).
`--against FILE` times another version of train/sinkhorn_kernels.py beside them (an older commit's, from
`git archive`), in the same replays.

    python benches/sinkhorn_probe.py [--preset small --iters 5] [--against OLD/dormouse/train/sinkhorn_kernels.py]
"""

import argparse
import collections
import functools
import importlib.util

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
    ap.add_argument("--against", help="another sinkhorn_kernels.py to time beside this tree's")
    args = ap.parse_args()
    bench = functools.partial(triton.testing.do_bench_cudagraph, rep=50, return_mode="median")
    total = {"torch": 0.0, "triton": 0.0}
    other = None
    if args.against:
        spec = importlib.util.spec_from_file_location("other_sinkhorn_kernels", args.against)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        total["against"] = 0.0
    for (m, n), count in sorted(shape_groups(args.preset).items()):
        u = torch.randn(count, m, n, generator=torch.Generator().manual_seed(m * n)).cuda()
        ref, got = sr_sinkhorn_torch(u, args.iters, 1e-12), sr_sinkhorn(u, args.iters)
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        times = {"torch": bench(lambda u=u: sr_sinkhorn_torch(u, args.iters, 1e-12))}
        times["triton"] = bench(lambda u=u: sr_sinkhorn(u, args.iters))
        if other is not None:
            times["against"] = bench(lambda u=u: other.sr_sinkhorn(u, args.iters, 1e-12))
        for name in total:
            total[name] += times[name]
        line = ", ".join(f"{name} {t * 1e3:7.1f} us" for name, t in times.items())
        print(f"[{count}, {m}, {n}]: {line}; triton vs torch max|d|/max|ref| {err:.1e}")
    print("all groups: " + ", ".join(f"{name} {t * 1e3:.1f} us" for name, t in total.items()) + " a step")


if __name__ == "__main__":
    main()
