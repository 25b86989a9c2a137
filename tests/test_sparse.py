import io
import math
import time

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from dormouse import rng
from dormouse.train.sparse import RowPlan, SparseRowAdam, clip_grad_norm_

F64 = torch.float64
LR, B1, B2, EPS = 0.1, 0.9, 0.95, 1e-8


def randn(*shape, seed: int = 0, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=rng.generator(seed, 0, "test"), dtype=dtype)


def sparse_grad(rows: list[int], vals: torch.Tensor, n: int) -> torch.Tensor:
    """An uncoalesced row-sparse gradient (duplicates allowed, as nn.Embedding(sparse=True) makes)."""
    return torch.sparse_coo_tensor(torch.tensor([rows]), vals, (n, vals.shape[1]), check_invariants=True)


class HandAdam:
    """Row-wise lazy Adam with per-row steps, in Python floats, one row and one entry at a time."""

    def __init__(self, w: torch.Tensor):
        self.w = w.tolist()
        self.m = [[0.0] * len(r) for r in self.w]
        self.v = [[0.0] * len(r) for r in self.w]
        self.s = [0] * len(self.w)

    def step(self, dense_grad: torch.Tensor) -> None:
        g = dense_grad.tolist()
        for r in range(len(self.w)):
            if not any(x != 0 for x in g[r]):
                continue
            self.s[r] += 1
            bc1, bc2 = 1 - B1 ** self.s[r], 1 - B2 ** self.s[r]
            for c in range(len(self.w[r])):
                self.m[r][c] = B1 * self.m[r][c] + (1 - B1) * g[r][c]
                self.v[r][c] = B2 * self.v[r][c] + (1 - B2) * g[r][c] ** 2
                denom = math.sqrt(self.v[r][c]) / math.sqrt(bc2) + EPS
                self.w[r][c] -= LR / bc1 * self.m[r][c] / denom


def test_steps_equal_a_hand_written_row_wise_adam_and_leave_other_rows_bit_identical():
    w0 = randn(12, 3)
    table = nn.Parameter(w0.clone())
    opt = SparseRowAdam([table], lr=LR, betas=(B1, B2), eps=EPS)
    hand = HandAdam(w0)
    # Step 1 touches rows 2, 5 (twice: summed), 11; step 2 touches 5 again (its 2nd step) and 7 (its 1st);
    # row 9 appears with an exactly zero gradient and must be left alone.
    steps = [([5, 2, 5, 11], randn(4, 3, seed=1)), ([7, 5, 9], torch.cat([randn(2, 3, seed=2), torch.zeros(1, 3)]))]
    snapshots = []
    for rows, vals in steps:
        table.grad = sparse_grad(rows, vals, 12)
        hand.step(table.grad.to_dense())
        opt.step()
        snapshots.append({k: v.clone() for k, v in opt.state[table].items()})
        torch.testing.assert_close(table.detach(), torch.tensor(hand.w, dtype=F64), rtol=1e-14, atol=1e-15)
        torch.testing.assert_close(opt.state[table]["exp_avg"], torch.tensor(hand.m, dtype=F64), rtol=1e-14, atol=0)
        torch.testing.assert_close(opt.state[table]["exp_avg_sq"], torch.tensor(hand.v, dtype=F64), rtol=1e-14, atol=0)
    assert opt.row_steps(table).tolist() == [0, 0, 1, 0, 0, 2, 0, 1, 0, 0, 0, 1] == hand.s
    assert opt.rows_updated == 2
    untouched = [0, 1, 3, 4, 6, 8, 9, 10]
    assert torch.equal(table.detach()[untouched], w0[untouched])  # bitwise
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(opt.state[table][key][untouched], torch.zeros(8, 3))
        # rows 2 and 11 sat out step 2: their moments did not decay (lazy Adam)
        assert torch.equal(snapshots[1][key][[2, 11]], snapshots[0][key][[2, 11]])
    # The first update of a row is full size (|Δw| ≈ lr per entry), even at the table's 2nd step.
    assert torch.allclose((table.detach()[7] - w0[7]).abs(), torch.full((3,), LR, dtype=F64), rtol=1e-6)


def test_a_dense_gradient_gives_the_same_update_bit_for_bit():
    w0 = randn(30, 4, seed=3)
    tabs = [nn.Parameter(w0.clone()) for _ in range(2)]
    opts = [SparseRowAdam([t], lr=LR) for t in tabs]
    for i in range(3):
        g = sparse_grad([i, 3 * i + 1, 17, i], randn(4, 4, seed=10 + i), 30)
        tabs[0].grad, tabs[1].grad = g, g.to_dense()
        for o in opts:
            o.step()
    assert torch.equal(tabs[0], tabs[1])
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(opts[0].state[tabs[0]][key], opts[1].state[tabs[1]][key])


def test_lr_zero_leaves_the_weights_bit_identical():
    w0 = randn(10, 2, seed=4)
    table = nn.Parameter(w0.clone())
    opt = SparseRowAdam([table], lr=0.0)
    for i in range(3):
        table.grad = sparse_grad([i, 9], randn(2, 2, seed=20 + i), 10)
        opt.step()
    assert torch.equal(table.detach(), w0)
    assert opt.row_steps(table).tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0, 3]  # the state still moves


def test_a_step_on_a_million_row_table_costs_the_touched_rows_only():
    n, dim = 10**6, 16
    emb = nn.Embedding(n, dim, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(n, dim, generator=rng.generator(0, 0, "test")))
    w0 = emb.weight.detach().clone()
    opt = SparseRowAdam(emb.parameters(), lr=1e-2)
    gen = rng.generator(1, 0, "test")
    touched, times, pointers = set(), [], set()
    for i in range(4):
        ids = torch.randint(0, n, (128,), generator=gen)
        ids[:28] = ids[28:56]  # ~100 distinct rows, some looked up twice
        touched.update(ids.tolist())
        emb(ids).pow(2).sum().backward()
        assert emb.weight.grad.is_sparse and emb.weight.grad._nnz() == 128
        if i == 3:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                opt.step()
            allocated = sum(max(e.self_cpu_memory_usage, 0) for e in prof.key_averages())
        else:
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        assert opt.rows_updated == 100
        pointers.add((opt.state[emb.weight]["exp_avg"].data_ptr(), opt.state[emb.weight]["exp_avg_sq"].data_ptr()))
        opt.zero_grad()
    # The first step allocates the state (2 × 64 MB + 8 MB, once); later steps touch ~100 rows.
    assert times[0] < 1.0 and max(times[1:]) < 0.05, times  # measured ~0.12 s, then ~1 ms
    assert allocated < 200_000, allocated  # measured ~88 kB; the table is 64 MB
    assert len(pointers) == 1  # the state was allocated once and is updated in place
    state = opt.state[emb.weight]
    mask = torch.ones(n, dtype=torch.bool)
    mask[list(touched)] = False
    assert torch.equal(emb.weight.detach()[mask], w0[mask])  # 10^6 − ~400 rows, bitwise
    assert not torch.equal(emb.weight.detach()[~mask], w0[~mask])
    assert int((state["step"] > 0).sum()) == len(touched) and not state["exp_avg"][mask].any()


def test_the_dense_path_would_fail_the_footprint_check():
    # The check above can fail: finding the rows of a dense gradient reads and allocates O(table).
    emb = nn.Embedding(10**6, 16)
    opt = SparseRowAdam(emb.parameters(), lr=1e-2)
    emb(torch.arange(100)).sum().backward()
    opt.step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        opt.step()
    assert sum(max(e.self_cpu_memory_usage, 0) for e in prof.key_averages()) > 10**6


def run(table: nn.Parameter, opt: SparseRowAdam, steps: range) -> None:
    for i in steps:
        g = rng.generator(7, i, "test")
        rows = torch.randint(0, table.shape[0], (9,), generator=g).tolist()
        table.grad = sparse_grad(rows, torch.randn(9, table.shape[1], generator=g, dtype=table.dtype), table.shape[0])
        opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_continues_bit_for_bit(dtype):
    w0 = randn(40, 5, seed=5).to(dtype)
    ref = nn.Parameter(w0.clone())
    ref_opt = SparseRowAdam([ref], lr=LR)
    run(ref, ref_opt, range(5))

    first = nn.Parameter(w0.clone())
    first_opt = SparseRowAdam([first], lr=LR)
    run(first, first_opt, range(3))
    buf = io.BytesIO()
    torch.save({"table": first.detach(), "opt": first_opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = nn.Parameter(saved["table"].clone())
    resumed_opt = SparseRowAdam([resumed], lr=LR)
    resumed_opt.load_state_dict(saved["opt"])
    st = resumed_opt.state[resumed]
    assert st["exp_avg"].dtype == torch.promote_types(dtype, torch.float32)  # fp32 moments kept for bf16
    assert st["step"].dtype == torch.int64 and int(st["step"].sum()) > 0
    run(resumed, resumed_opt, range(3, 5))
    assert torch.equal(resumed, ref)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(resumed_opt.state[resumed][key], ref_opt.state[ref][key]), key


def test_load_refuses_a_state_of_another_shape():
    a, b = nn.Parameter(torch.zeros(8, 2)), nn.Parameter(torch.zeros(9, 2))
    opt_a = SparseRowAdam([a], lr=LR)
    a.grad = sparse_grad([1], torch.ones(1, 2), 8)
    opt_a.step()
    with pytest.raises(ValueError, match=r"table is \(9, 2\)"):
        SparseRowAdam([b], lr=LR).load_state_dict(opt_a.state_dict())


def test_refusals():
    with pytest.raises(ValueError, match="no weight decay"):
        SparseRowAdam([nn.Parameter(torch.zeros(4, 2))], lr=LR, weight_decay=0.1)
    with pytest.raises(ValueError, match="no weight decay"):
        SparseRowAdam([{"params": [nn.Parameter(torch.zeros(4, 2))], "weight_decay": 0.1}], lr=LR)
    with pytest.raises(ValueError, match="2-D tables"):
        SparseRowAdam([nn.Parameter(torch.zeros(4))], lr=LR)


def test_clip_grad_norm_takes_sparse_gradients_and_equals_torch_on_dense_ones():
    def params():
        table = nn.Parameter(torch.zeros(20, 3))
        table.grad = sparse_grad([1, 4, 1], torch.tensor([[3.0, 0, 0], [0, 4, 0], [1.0, 0, 0]]), 20)
        dense = nn.Parameter(torch.zeros(2, 2))
        dense.grad = torch.tensor([[0.0, 0.0], [0.0, 4.0]])
        return table, dense

    table, dense = params()
    total = clip_grad_norm_([table, dense], max_norm=3.0)
    # summed row 1 is (4, 0, 0): total = sqrt(16 + 16 + 16) = sqrt(48); coefficient 3 / (sqrt(48) + 1e-6)
    assert float(total) == pytest.approx(math.sqrt(48), rel=1e-7)
    coef = 3.0 / (math.sqrt(48) + 1e-6)
    assert table.grad.is_sparse and table.grad.is_coalesced()
    torch.testing.assert_close(table.grad.to_dense()[[1, 4]], torch.tensor([[4 * coef, 0, 0], [0, 4 * coef, 0]]))
    torch.testing.assert_close(dense.grad, torch.tensor([[0.0, 0.0], [0.0, 4 * coef]]))
    # Dense only: torch's own function, bit for bit.
    ps = [nn.Parameter(randn(5, 3, seed=s, dtype=torch.float32)) for s in range(3)]
    qs = [nn.Parameter(p.detach().clone()) for p in ps]
    for i, (p, q) in enumerate(zip(ps, qs, strict=True)):
        p.grad = randn(5, 3, seed=10 + i, dtype=torch.float32)
        q.grad = p.grad.clone()
    assert torch.equal(clip_grad_norm_(ps, 0.5), torch.nn.utils.clip_grad_norm_(qs, 0.5))
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ps, qs, strict=True))


def test_the_step_leaves_deterministic_mode_as_it_found_it():
    # The row writes turn deterministic mode off around themselves (distinct rows: any order, same bits).
    table = nn.Parameter(randn(6, 2, seed=5))
    opt = SparseRowAdam([table], lr=LR)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        for mode in ((True, False), (True, True), (False, False)):
            torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])
            table.grad = sparse_grad([1, 4, 1], randn(3, 2, seed=6), 6)
            opt.step()
            assert (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ) == mode
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_a_row_plan_coalesces_as_the_lookups_sum_one_by_one_from_zero():
    # Rows 3, 1, 3, 0, 1, 3: distinct rows 0, 1, 3; row 3's sum is ((0 + v0) + v2) + v5 in fp32, in the
    # lookups' order (the order torch's CUDA coalesce adds them in: tests/gpu/test_row_plan.py).
    rows = torch.tensor([[3, 1, 3], [0, 1, 3]])
    vals = randn(6, 4, seed=3, dtype=torch.float32) * torch.tensor([1.0, 1e4, 1e-4, 1.0])  # rounding matters
    plan = RowPlan(rows)
    assert plan.count == 3
    grad = plan.coalesce(vals, 5)
    assert grad.is_coalesced() and grad.shape == (5, 4)
    assert grad.indices().tolist() == [[0, 1, 3]]
    want = torch.zeros(3, 4)
    for i, r in enumerate([3, 1, 3, 0, 1, 3]):
        k = {0: 0, 1: 1, 3: 2}[r]
        want[k] = want[k] + vals[i]
    assert torch.equal(grad.values(), want)
    exact = torch.zeros(5, 4, dtype=F64).index_add_(0, rows.reshape(-1), vals.double())
    torch.testing.assert_close(grad.to_dense().double(), exact, rtol=1e-6, atol=0)
