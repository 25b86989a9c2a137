"""Probe fla's KDA kernel choices at the model's batch: for each of the four largest autotuned KDA kernels, every
configuration it may take (and its 4-warp ones with 8 warps, outside fla's list), timed as the whole
forward and backward of one layer's mixer (model/kda_fla.py's Function at [B, T, H, K] in bf16 with the
layer's options: the gate and beta's sigmoid in the kernel, safe_gate, the forward's intermediates
kept), the other kernels as pinned. The pin
(dormouse/model/fla_configs) holds Triton's choices at batch 10 (fla's keys leave the batch out): this
says what batch 64 would choose and save. With --out DIR it writes DIR/pin: the committed pin with each
kernel's fastest configuration here where it beat the pinned one by more than --margin (for a bench run
with FLA_CONFIG_DIR=DIR/pin FLA_CACHE_MODE=fuzzy). Measures; changes nothing in the repo.

    python benches/kda_config_probe.py [--batch 64 --seq-len 512 --heads 8 --head-dim 64 --out DIR]
"""

import argparse
import shutil
from pathlib import Path

import torch
import triton
from conv_probe import median_ms
from triton.runtime.errors import OutOfResources

from dormouse import rng
from dormouse.model import fla_kernels, precision
from dormouse.model.kda_fla import chunk_kda_sunk

# fla's four largest KDA kernels in a B 64 step (session 22's profile: 3.7, 3.4, 0.76, 0.70 ms), largest
# first; 48 configs in all, a few seconds each to compile
KERNELS = (
    "chunk_kda_bwd_kernel_wy_dqkg_fused",
    "chunk_kda_bwd_kernel_intra",
    "chunk_kda_fwd_kernel_inter_solve_fused",
    "chunk_kda_fwd_kernel_intra_sub_chunk",
)
PIN = Path(__file__).resolve().parents[1] / "dormouse/model/fla_configs/NVIDIA_H200"


def describe(config) -> str:
    return f"{dict(config.kwargs)} warps {config.num_warps} stages {config.num_stages}"


def wider(configs: list) -> list:
    """Each 4-warp config with 8 warps, where fla's list has none: fla offers the wy_dqkg backward only 2
    or 4 warps on Hopper, and with 4 its pinned config spills ~4 KB a thread where 8 spill ~0.3 KB
    (benches/compile_fla_kernels.py, session 23: a lead, not a measurement)."""
    listed = {describe(c) for c in configs}
    out = []
    for c in configs:
        if c.num_warps == 4:
            w = triton.Config(dict(c.kwargs), num_warps=8, num_stages=c.num_stages)
            if describe(w) not in listed:
                listed.add(describe(w))
                out.append(w)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--margin", type=float, default=0.01, help="fraction a config must beat the pinned one by")
    ap.add_argument("--out", type=Path, help="write OUT/pin: the pin with the faster choices")
    args = ap.parse_args()
    print(precision.apply("bf16"), fla_kernels.pin_note(), sep="\n")
    B, T, H, K = args.batch, args.seq_len, args.heads, args.head_dim
    gen = rng.generator(0, 0, "bench")
    unit = (torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1) for _ in "qk")
    q, k = (t.cuda().bfloat16().requires_grad_() for t in unit)
    v, g = (torch.randn(B, T, H, K, generator=gen).cuda().bfloat16().requires_grad_() for _ in "vg")
    beta = torch.randn(B, T, H, generator=gen).cuda().bfloat16().requires_grad_()
    A_log = torch.randn(H, generator=gen).cuda().requires_grad_()
    dt_bias = torch.randn(H * K, generator=gen).cuda().requires_grad_()
    sinks = [torch.zeros((), device="cuda").expand(B, T, H, K).requires_grad_() for _ in "qk"]
    do = torch.randn(B, T, H, K, generator=gen).cuda().bfloat16()
    options = {"safe_gate": True, "lower_bound": -5.0, "disable_recompute": True}

    def step():
        chunk_kda_sunk(q, k, v, g, beta, A_log, dt_bias, *sinks, chunk_size=64, options=options).backward(do)

    step()
    pinned_ms = median_ms(step)
    print(f"[{B}, {T}, {H}, {K}] forward + backward, every kernel as pinned: {pinned_ms:.3f} ms")
    tuners = dict(fla_kernels._autotuners())
    for name in KERNELS:
        tuner = tuners.get(name)
        if tuner is None or not tuner.cache:
            print(f"{name}: not run")
            continue
        pinned = dict(tuner.cache)
        results = []
        for config in tuner.configs + wider(tuner.configs):
            tuner.cache.update(dict.fromkeys(pinned, config))
            try:
                step()
                ms = median_ms(step)
            except (OutOfResources, RuntimeError) as err:  # a config this card cannot run
                print(f"  {name} {describe(config)}: {type(err).__name__}")
                continue
            mark = " (pinned)" if describe(config) == describe(next(iter(pinned.values()))) else ""
            print(f"  {name} {describe(config)}: {ms:.3f} ms ({ms - pinned_ms:+.3f}){mark}")
            results.append((ms, config))
        best_ms, best = min(results, key=lambda r: r[0])
        keep = best_ms < pinned_ms * (1 - args.margin)
        tuner.cache.update(dict.fromkeys(pinned, best) if keep else pinned)
        print(f"{name}: fastest {describe(best)} {best_ms:.3f} ms, {'taken' if keep else 'pinned kept'}")
        if keep:
            step()
            pinned_ms = median_ms(step)
    print(f"forward + backward with the choices taken: {pinned_ms:.3f} ms")
    if args.out:
        folder = args.out / "pin"
        shutil.copytree(PIN, folder, dirs_exist_ok=True)
        print("written:", *fla_kernels.dump_choices(folder))


if __name__ == "__main__":
    main()
