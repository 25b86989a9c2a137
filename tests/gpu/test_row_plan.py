"""RowPlan on CUDA (dormouse/train/sparse.py): a table gradient coalesced by a plan made ahead equals
torch's `coalesce` bit for bit (so a --cuda-graph step's tables learn as the eager step's), and coalescing
with it makes no host sync. Skipped without CUDA; the CPU's arithmetic: tests/test_sparse.py."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from dormouse.train.sparse import RowPlan  # noqa: E402


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
