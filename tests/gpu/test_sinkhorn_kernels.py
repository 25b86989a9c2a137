"""dormouse's SR-Sinkhorn Triton kernels (ops/sinkhorn/triton.py) against torch's form in fp64, and
NesterovSinkhorn's momentum kernel (ops/momentum/triton.py) against its formulas; skipped without CUDA.

The kernels keep the matrix as diag(r)·U·diag(c) and round in other places than torch's successive
rescalings, summing the same squares in another order, so they are held to fp32's own error: within 4e-6
of the fp64 result (max|d|, entries of RMS 1), as torch's fp32 form is (~9e-7 for both on an H200; ~1e-6
under the Triton interpreter on a CPU). All-zero
rows and columns stay zero (and finite: their scales are kept, not compounded to inf), a call gives the
same bits twice, and rows wider than one block (the looping path) and one-row or one-column matrices are
covered.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from dormouse.ledger import FallbackRefused  # noqa: E402
from dormouse.ops import momentum, sinkhorn  # noqa: E402
from dormouse.ops.sinkhorn import reference as sinkhorn_reference  # noqa: E402
from dormouse.train import optim  # noqa: E402

try:
    kernels = sinkhorn.kernels(torch.device("cuda"))
except FallbackRefused as err:
    pytest.skip(f"needs Triton: {err}", allow_module_level=True)

FP32_ERROR = 4e-6


def stack(*shape, seed=0):
    """A random fp64 stack [N, m, n]; row 3 of the first matrix and column 5 of the last all zero (when
    there are that many)."""
    u = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    u[0, 3:4] = 0
    u[-1, :, 5:6] = 0
    return u


@pytest.mark.parametrize(
    "shape", [(16, 512, 512), (8, 1536, 512), (4, 512, 1536), (3, 70, 100), (2, 300, 33), (1, 1, 64), (1, 64, 1)]
)
def test_kernels_match_fp64_torch_to_fp32_error(shape):
    u = stack(*shape)
    want = sinkhorn_reference.sr_sinkhorn(u, 5, 1e-12)
    got = sinkhorn.sr_sinkhorn(u.float().cuda(), 5)
    torch_fp32 = sinkhorn_reference.sr_sinkhorn(u.float().cuda(), 5, 1e-12)
    assert (got.double().cpu() - want).abs().max().item() <= FP32_ERROR
    assert (torch_fp32.double().cpu() - want).abs().max().item() <= FP32_ERROR
    assert (got[0, 3:4] == 0).all() and (got[-1, :, 5:6] == 0).all() and torch.isfinite(got).all()
    assert torch.equal(got, sinkhorn.sr_sinkhorn(u.float().cuda(), 5))  # the same bits from call to call


def test_rows_wider_than_a_block_loop(monkeypatch):
    monkeypatch.setattr(kernels, "ROW_BLOCK", 64)
    monkeypatch.setattr(kernels, "PARTS_AT_ONCE", 2)
    u = stack(2, 500, 300, seed=1)
    got = sinkhorn.sr_sinkhorn(u.float().cuda(), 5)
    assert (got.double().cpu() - sinkhorn_reference.sr_sinkhorn(u, 5, 1e-12)).abs().max().item() <= FP32_ERROR


def test_a_matrix_runs_as_a_stack_of_one_and_fp64_stays_torch():
    u = stack(1, 96, 80, seed=2)
    matrix = sinkhorn.sr_sinkhorn(u[0].float().cuda(), 5)
    assert matrix.shape == (96, 80) and torch.equal(matrix, sinkhorn.sr_sinkhorn(u.float().cuda(), 5)[0])
    fp64 = sinkhorn.sr_sinkhorn(u.cuda(), 5)
    assert fp64.dtype == torch.float64 and torch.equal(fp64, sinkhorn_reference.sr_sinkhorn(u.cuda(), 5, 1e-12))


@pytest.mark.parametrize("skip", [None, False, True], ids=["no-found-inf", "run", "skipped"])
def test_momentum_kernel_matches_fp64_and_a_skipped_step_keeps_m_bit_for_bit(skip):
    # ops/momentum/triton.py through momentum.momentum_lookahead_: M and U within fp32's error of the fp64
    # formulas (entries of RMS ~1); a skipped step (found_inf 1, a NaN in G) leaves M bit for bit.
    gen = torch.Generator().manual_seed(3)
    g, m = (torch.randn(3, 1536, 512, generator=gen, dtype=torch.float64) for _ in range(2))
    found_inf = None if skip is None else torch.tensor(float(skip), device="cuda")
    g32, m32 = g.float().cuda(), m.float().cuda()
    if skip:
        g32[0, 0, 0] = float("nan")
    before = m32.clone()
    u = momentum.momentum_lookahead_(g32, m32, 0.95, found_inf)
    kept, g_ref = (1.0, torch.zeros_like(g)) if skip else (0.95, g)
    m_ref = kept * m + 0.05 * g_ref
    assert (m32.double().cpu() - m_ref).abs().max().item() <= FP32_ERROR
    assert (u.double().cpu() - (0.05 * g_ref + 0.95 * m_ref)).abs().max().item() <= FP32_ERROR
    if skip:
        assert torch.equal(m32, before)


@pytest.mark.parametrize("capturable", [False, True], ids=["lr-numbers", "lr-tensors"])
def test_nesterov_sinkhorn_on_cuda_steps_the_weights_as_fp64_torch(capturable):
    # On CUDA in fp32 the step ends in the Sinkhorn kernels' last pass, written into the weights through
    # a table of their addresses (sinkhorn_step_): three steps of two shape groups within fp32's error of
    # the same optimizer in fp64 on the CPU (torch's form), the momentum too.
    gen = torch.Generator().manual_seed(4)
    shapes = [(1536, 512), (512, 512), (1536, 512)]
    w0 = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(3)]
    results = {}
    for device, dtype in (("cuda", torch.float32), ("cpu", torch.float64)):
        ws = [torch.nn.Parameter(w.to(device, dtype)) for w in w0]
        opt = optim.NesterovSinkhorn(ws, lr=0.01, weight_decay=0.1, capturable=capturable and device == "cuda")
        for step in grads:
            for w, g in zip(ws, step, strict=True):
                w.grad = g.to(device, dtype)
            if opt.capturable:
                opt.load_lr_()
            opt.step()
        results[device] = (
            [w.detach().double().cpu() for w in ws],
            [opt.state[w]["momentum_buffer"].double().cpu() for w in ws],
        )
    for got, want in zip(*(sum(results[d], []) for d in ("cuda", "cpu")), strict=True):
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
