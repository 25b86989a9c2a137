"""RowPlan on CUDA (dormouse/train/sparse.py): a table gradient coalesced by a plan made ahead equals
torch's `coalesce` bit for bit (so a --cuda-graph step's tables learn as the eager step's), and coalescing
with it makes no host sync. SparseRowAdam's row kernel (ops/row_adam/triton.py) against the torch
path in float64. Skipped without CUDA; the CPU's arithmetic: tests/test_sparse.py."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from dormouse.train.sparse import RowPlan, SparseRowAdam  # noqa: E402


@pytest.mark.parametrize("lookups,rows", [(196608, 393216), (50000, 700), (5, 3)])
def test_a_row_plan_coalesces_as_torch_does_and_without_a_host_sync(lookups, rows):
    g = torch.Generator(device="cuda").manual_seed(lookups)
    index = torch.randint(0, rows, (lookups,), device="cuda", generator=g)
    values = torch.randn(lookups, 64, device="cuda", generator=g)
    want = torch.sparse_coo_tensor(index.unsqueeze(0), values, (rows, 64)).coalesce()
    plan = RowPlan(index)
    assert plan.count == want.indices().shape[1]  # the count's copy read once, before the watch
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = plan.coalesce(values, rows)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert got.is_coalesced()
    assert torch.equal(got.indices(), want.indices())
    assert torch.equal(got.values(), want.values())


@pytest.mark.parametrize("lr", [1e-2, 0.0], ids=["step", "lr-0"])
def test_sparse_row_adam_on_cuda_matches_the_torch_path_in_float64(lr):
    # Four steps of a [700, 64] table with repeated rows, a row whose gradient sums to zero, and a skipped
    # step (found_inf 1): the kernel's rows, moments and counts within fp32's error of the torch path's in
    # float64 on the CPU; rows never touched, and everything in the skipped step, bit for bit.
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(700, 64, generator=gen, dtype=torch.float64)
    steps = []
    for _ in range(4):
        index = torch.randint(0, 600, (5000,), generator=gen)
        values = torch.randn(5000, 64, generator=gen, dtype=torch.float64)
        values[index == 7] = 0  # row 7: looked up, a zero gradient
        steps.append((index, values))
    results = {}
    for device, dtype in (("cuda", torch.float32), ("cpu", torch.float64)):
        w = torch.nn.Parameter(w0.to(device, dtype))
        opt = SparseRowAdam([w], lr=lr)
        for i, (index, values) in enumerate(steps):
            w.grad = torch.sparse_coo_tensor(index.unsqueeze(0), values, (700, 64)).to(device, dtype)
            opt.found_inf = torch.tensor(float(i == 2), device=device)
            before = (w.detach().clone(), *(t.clone() for t in opt.state[w].values())) if opt.state[w] else None
            opt.step()
            if i == 2:
                after = (w.detach(), *opt.state[w].values())
                assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)), device
        results[device] = [w.detach(), *opt.state[w].values()]
    for got, want in zip(results["cuda"], results["cpu"], strict=True):
        if got.dtype == torch.int64:
            assert torch.equal(got.cpu(), want)
        else:
            assert (got.double().cpu() - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    assert torch.equal(results["cuda"][0][600:].cpu(), w0[600:].float())  # rows never looked up
