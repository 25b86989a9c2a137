"""Probe, before building it, an engram-table update a CUDA graph could hold (docs/performance.md, Next).

On the H200 at `small` B 64 the GPU idles ~6 ms a step while the host runs the eager engram update: the
looked-up rows' gradient made a sparse COO tensor, coalesced (its size is data-dependent: the host waits
for the GPU to count), clipped, and `SparseRowAdam`'s row step. The candidate keeps every shape static:
the table's gradient summed densely, `dense.index_add_(0, rows, grads)` (deterministic mode's sorting
path), and the lazy-Adam rule as a masked update of every row (`torch.where` on rows with a non-zero
gradient). This measures, at the model's sizes and with its own n-gram keys of real bytes:

1. the eager update as it runs now (COO, coalesce, `SparseRowAdam.step`): median ms with the host's waits;
2. the dense gradient: whether deterministic `index_add_` can be captured in a CUDA graph, and its time;
3. the masked dense update: its time replayed, and whether it gives `SparseRowAdam`'s bits on the same
   gradient (it should: the same elementwise arithmetic per row).

    python benches/engram_update_probe.py --data .gpu-data/ts-val [--batch 64 --seq-len 512]

On a CPU it runs the same arithmetic checks at the sizes given, without the graph.
"""

import argparse
import statistics
import time

import numpy as np
import torch

from dormouse import config
from dormouse.data.shards import load_corpus
from dormouse.model.engram import global_rows
from dormouse.model.model import DormouseLM
from dormouse.train.sparse import SparseRowAdam

BETAS, EPS, LR = (0.9, 0.95), 1e-8, 3e-3


def median_ms(fn, device: torch.device, reps: int = 20) -> float:
    """Median wall ms of `fn()` including a device sync: what the step pays, host waits included."""
    times = []
    for _ in range(reps + 3):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[3:])


def masked_dense_step(w, m, v, s, g, lr: torch.Tensor) -> None:
    """`SparseRowAdam`'s rule on every row at once, rows with an all-zero gradient left as they are: static
    shapes, no host sync; `lr` a device tensor so that a captured graph reads the step's rate."""
    keep = g.ne(0).any(dim=1, keepdim=True)
    s.add_(keep.squeeze(1))
    m.copy_(torch.where(keep, m.mul(BETAS[0]).add_(g, alpha=1 - BETAS[0]), m))
    v.copy_(torch.where(keep, v.mul(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1]), v))
    sf = s.clamp(min=1).to(torch.float64)
    step_size = (lr / (1 - torch.pow(BETAS[0], sf))).to(m.dtype).unsqueeze(1)
    bc2_sqrt = torch.sqrt(1 - torch.pow(BETAS[1], sf)).to(m.dtype).unsqueeze(1)
    denom = v.sqrt().div_(bc2_sqrt).add_(EPS)
    w.copy_(torch.where(keep, w - step_size * (m / denom), w))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a prepared corpus folder (dormouse prepare)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.use_deterministic_algorithms(True)  # as every dormouse run (model/precision.py)
    cfg = config.resolve(config.build(args.preset), cuda_available=device.type == "cuda")
    model = DormouseLM(cfg.model, seed=0).to(device)
    (j, memory), *_ = model.memories()
    R, D = memory.table.weight.shape
    corpus = load_corpus(args.data)
    rng = np.random.default_rng(0)
    size = corpus.split_size("train") - args.seq_len
    x = torch.tensor(
        np.stack([corpus.read("train", int(o), args.seq_len) for o in rng.integers(0, size, args.batch)]),
        dtype=torch.long,
        device=device,
    )
    rows = global_rows(memory.keys(x), memory.rows).reshape(-1)
    grads = torch.randn(rows.numel(), D, generator=torch.Generator().manual_seed(1)).to(device) * 1e-3
    distinct = int(torch.unique(rows).numel())
    print(f"table [{R}, {D}] fp32; {rows.numel()} lookups of batch [{args.batch}, {args.seq_len}], {distinct} rows")

    # 1. now: COO, coalesce, SparseRowAdam's step (its state allocated by a first step)
    table = torch.nn.Parameter(torch.zeros(R, D, device=device))
    opt = SparseRowAdam([table], lr=LR, betas=BETAS, eps=EPS)

    def eager():
        table.grad = torch.sparse_coo_tensor(rows[None], grads, (R, D), check_invariants=False).coalesce()
        opt.step()

    eager()
    print(
        f"1. eager (COO, coalesce, SparseRowAdam.step): {median_ms(eager, device):.3f} ms a step, host waits included"
    )

    # 2. the dense gradient by deterministic index_add_
    dense = torch.zeros(R, D, device=device)

    def scatter():
        dense.zero_()
        dense.index_add_(0, rows, grads)

    scatter()
    coalesced = torch.sparse_coo_tensor(rows[None], grads, (R, D), check_invariants=False).coalesce().to_dense()
    print(
        f"2. dense gradient: index_add_ equals coalesce's sums bit for bit: {torch.equal(dense, coalesced)}; "
        f"max |d| {(dense - coalesced).abs().max().item():.3g}; eager {median_ms(scatter, device):.3f} ms"
    )

    # 3. the masked dense update against SparseRowAdam on the same (coalesced) gradient
    w, m, v = (torch.zeros(R, D, device=device) for _ in range(3))
    s = torch.zeros(R, dtype=torch.int64, device=device)
    lr = torch.tensor(LR, dtype=torch.float64, device=device)
    ref = torch.nn.Parameter(torch.zeros(R, D, device=device))
    ref_opt = SparseRowAdam([ref], lr=LR, betas=BETAS, eps=EPS)
    for _ in range(2):
        masked_dense_step(w, m, v, s, coalesced, lr)
        ref.grad = torch.sparse_coo_tensor(rows[None], grads, (R, D), check_invariants=False).coalesce()
        ref_opt.step()
    same = torch.equal(w, ref.detach()) and torch.equal(m, ref_opt.state[ref]["exp_avg"])
    print(
        f"3. masked dense update gives SparseRowAdam's bits: {same}; "
        f"eager {median_ms(lambda: masked_dense_step(w, m, v, s, dense, lr), device):.3f} ms"
    )
    if device.type != "cuda":
        return
    for name, fn in (
        ("index_add_ (dense gradient)", scatter),
        ("masked dense update", lambda: masked_dense_step(w, m, v, s, dense, lr)),
    ):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
        except RuntimeError as err:  # a probe reports what the capture refused
            print(f"   {name}: not capturable: {str(err).splitlines()[0]}")
            continue
        print(f"   {name}: captured; replayed {median_ms(graph.replay, device):.3f} ms")


if __name__ == "__main__":
    main()
