"""benches/engram_update_probe.py's candidate: the lazy-Adam rule as a masked update of every row gives
SparseRowAdam's bits on the same gradient (rows never looked up, and rows whose summed gradient is
exactly zero, left as they are)."""

import importlib.util
from pathlib import Path

import torch

from dormouse.train.sparse import SparseRowAdam

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("engram_update_probe", ROOT / "benches/engram_update_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def test_the_masked_dense_update_gives_sparse_row_adam_s_bits():
    R, D = 40, 3
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(R, D, generator=gen)
    w, m, v = w0.clone(), torch.zeros(R, D), torch.zeros(R, D)
    s = torch.zeros(R, dtype=torch.int64)
    ref = torch.nn.Parameter(w0.clone())
    opt = SparseRowAdam([ref], lr=probe.LR, betas=probe.BETAS, eps=probe.EPS)
    lr = torch.tensor(probe.LR, dtype=torch.float64)
    for step in range(3):
        rows = torch.randint(0, R, (25,), generator=gen)
        grads = torch.randn(25, D, generator=gen)
        grads[:3] = 0  # looked up with a zero gradient
        coo = torch.sparse_coo_tensor(rows[None], grads, (R, D), check_invariants=False).coalesce()
        probe.masked_dense_step(w, m, v, s, coo.to_dense(), lr)
        ref.grad = coo
        opt.step()
        state = opt.state[ref]
        assert torch.equal(w, ref.detach()), step
        assert (
            torch.equal(m, state["exp_avg"]) and torch.equal(v, state["exp_avg_sq"]) and torch.equal(s, state["step"])
        )
