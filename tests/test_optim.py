import io
import math

import pytest
import torch
from torch import nn

from dormouse import rng
from dormouse.config import TrainConfig
from dormouse.ops.sinkhorn import sr_sinkhorn
from dormouse.train.optim import NesterovSinkhorn
from dormouse.train.routing import build_optimizers, route
from dormouse.train.schedule import lr_multiplier

F64 = torch.float64


def randn(*shape, seed: int = 0, step: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=rng.generator(seed, step, "test"), dtype=dtype)


def row_col_err(x: torch.Tensor) -> tuple[float, float]:
    """max |row norm / √n − 1| and max |column norm / √m − 1|, measured in float64."""
    m, n = x.shape
    x = x.double()
    return (
        (x.norm(dim=1) / math.sqrt(n) - 1).abs().max().item(),
        (x.norm(dim=0) / math.sqrt(m) - 1).abs().max().item(),
    )


# ---- sr_sinkhorn ----


@pytest.mark.parametrize("shape", [(64, 32), (32, 64)])
def test_sinkhorn_columns_exact_rows_converge(shape):
    # fp32: the last half-step normalises columns, so they sit at √m up to rounding.
    for iters in (1, 5, 20):
        _, col = row_col_err(sr_sinkhorn(randn(*shape), iters))
        assert col < 1e-6, (iters, col)  # measured 1.3e-7 .. 2.1e-7 (≈ 1.4e-6 absolute on √64 = 8)
    # fp64, to see the convergence of the rows without the fp32 floor. Measured on this matrix:
    # 64×32: 4.48e-2 (1 iteration), 1.35e-5 (5), 2.2e-16 (20); 32×64: 4.84e-2, 9.84e-6, 2.2e-16.
    u = randn(*shape, dtype=F64)
    errs = {iters: row_col_err(sr_sinkhorn(u, iters)) for iters in (1, 5, 20)}
    rows = {iters: e[0] for iters, e in errs.items()}
    assert 1e-2 < rows[1] < 1e-1
    assert rows[5] < 3e-5
    assert rows[20] < 1e-14
    assert rows[1] > rows[5] > rows[20]
    assert max(e[1] for e in errs.values()) < 1e-14
    # Entry RMS is 1: the columns' squared norms sum to n·m.
    assert sr_sinkhorn(u, 5).pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=1e-14)


def test_sinkhorn_fp32_at_5_iterations_is_within_the_pinned_row_tolerance():
    # The optimizer runs 5 iterations in fp32: rows are √n to 3e-5 (measured 1.14e-5 and 5.2e-6).
    for shape in [(64, 32), (32, 64)]:
        row, _ = row_col_err(sr_sinkhorn(randn(*shape), 5))
        assert row < 3e-5, (shape, row)


def test_sinkhorn_2x2_by_hand():
    # u = [[3, 4], [0, 2]], one iteration, m = n = 2.
    # rows to √2:     [3, 4]·√2/5 = [0.6√2, 0.8√2];   [0, 2]·√2/2 = [0, √2]
    # columns to √2:  column 0 = [0.6√2, 0] → [√2, 0];   column 1 = [0.8√2, √2] has norm √2·√1.64
    #                 → [0.8√2/√1.64, √2/√1.64]
    u = torch.tensor([[3.0, 4.0], [0.0, 2.0]], dtype=F64)
    r2, r164 = math.sqrt(2), math.sqrt(1.64)
    want = torch.tensor([[r2, 0.8 * r2 / r164], [0.0, r2 / r164]], dtype=F64)
    torch.testing.assert_close(sr_sinkhorn(u, 1), want, rtol=0, atol=1e-15)


def test_sinkhorn_zero_rows_and_columns_stay_zero():
    u = randn(6, 5)
    u[2] = 0  # an unused embedding row
    u[:, 3] = 0
    x = sr_sinkhorn(u, 5)
    assert torch.isfinite(x).all()
    assert (x[2] == 0).all() and (x[:, 3] == 0).all()
    # The other columns still reach √m.
    cols = x.double().norm(dim=0)
    torch.testing.assert_close(cols[[0, 1, 2, 4]], torch.full((4,), math.sqrt(6), dtype=F64), rtol=1e-6, atol=0)
    assert (sr_sinkhorn(torch.zeros(3, 4), 5) == 0).all()


def test_sinkhorn_refuses_non_matrices():
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        sr_sinkhorn(torch.ones(4))
    with pytest.raises(ValueError, match="iters >= 1"):
        sr_sinkhorn(torch.ones(2, 2), 0)


# ---- NesterovSinkhorn ----


def sinkhorn_ref(u: list[list[float]], iters: int) -> list[list[float]]:
    """SR-Sinkhorn in plain Python floats, loop by loop (independent of sr_sinkhorn)."""
    m, n = len(u), len(u[0])
    x = [row[:] for row in u]
    for _ in range(iters):
        for i in range(m):
            s = math.sqrt(n) / math.sqrt(sum(v * v for v in x[i]))
            x[i] = [v * s for v in x[i]]
        for j in range(n):
            s = math.sqrt(m) / math.sqrt(sum(x[i][j] ** 2 for i in range(m)))
            for i in range(m):
                x[i][j] *= s
    return x


def nesterov_sinkhorn_ref(w, grads, lr, beta, wd, iters):
    """The module docstring's formulas, entry by entry in Python floats (float64)."""
    m, n = len(w), len(w[0])
    buf = [[0.0] * n for _ in range(m)]
    w = [row[:] for row in w]
    for g in grads:
        buf = [[beta * buf[i][j] + (1 - beta) * g[i][j] for j in range(n)] for i in range(m)]
        u = [[(1 - beta) * g[i][j] + beta * buf[i][j] for j in range(n)] for i in range(m)]
        x = sinkhorn_ref(u, iters)
        w = [[w[i][j] * (1 - lr * wd) - lr * x[i][j] for j in range(n)] for i in range(m)]
    return w, buf


@pytest.mark.parametrize(("dtype", "tol"), [(F64, 1e-13), (torch.float32, 2e-6)])
def test_nesterov_sinkhorn_two_steps_match_the_formulas(dtype, tol):
    w0 = randn(3, 4, seed=1, dtype=F64)
    grads = [randn(3, 4, seed=2, step=s, dtype=F64) for s in range(2)]
    lr, beta, wd = 0.1, 0.9, 0.05
    w = nn.Parameter(w0.to(dtype).clone())  # .to(float64) would alias w0
    opt = NesterovSinkhorn([w], lr=lr, momentum=beta, weight_decay=wd, iters=5)
    for g in grads:
        w.grad = g.to(dtype)
        opt.step()
    want_w, want_buf = nesterov_sinkhorn_ref(w0.tolist(), [g.tolist() for g in grads], lr, beta, wd, 5)
    got_buf = opt.state[w]["momentum_buffer"]
    assert got_buf.dtype == dtype
    torch.testing.assert_close(got_buf.double(), torch.tensor(want_buf, dtype=F64), rtol=0, atol=tol)
    torch.testing.assert_close(w.detach().double(), torch.tensor(want_w, dtype=F64), rtol=0, atol=tol)
    assert (w.detach().double() - w0).abs().max() > 0.1  # it moved: the check is not vacuous


def test_matrices_of_one_shape_step_together_as_each_would_alone():
    # The step stacks matrices of one shape into one batched SR-Sinkhorn: with three 3x4 matrices and a
    # 5x2 one in one optimizer, every matrix ends where the two-step formulas put it on its own.
    shapes = [(3, 4), (5, 2), (3, 4), (3, 4)]
    w0 = [randn(*s, seed=20 + i, dtype=F64) for i, s in enumerate(shapes)]
    grads = [[randn(*s, seed=30 + i, step=k, dtype=F64) for k in range(2)] for i, s in enumerate(shapes)]
    lr, beta, wd = 0.1, 0.9, 0.05
    ws = [nn.Parameter(w.clone()) for w in w0]
    opt = NesterovSinkhorn(ws, lr=lr, momentum=beta, weight_decay=wd, iters=5)
    for k in range(2):
        for w, g in zip(ws, grads, strict=True):
            w.grad = g[k].clone()
        opt.step()
    for w, start, g in zip(ws, w0, grads, strict=True):
        want, _ = nesterov_sinkhorn_ref(start.tolist(), [x.tolist() for x in g], lr, beta, wd, 5)
        torch.testing.assert_close(w.detach(), torch.tensor(want, dtype=F64), rtol=0, atol=1e-13)


def test_stacked_sr_sinkhorn_equals_each_matrix_alone():
    u = randn(4, 6, 3, seed=40, dtype=F64)
    stacked = sr_sinkhorn(u, 5)
    for i in range(4):
        torch.testing.assert_close(stacked[i], sr_sinkhorn(u[i], 5), rtol=0, atol=1e-15)


def test_weight_decay_is_decoupled():
    # Same gradients with and without decay: the momentum buffers are identical (decay never enters the
    # gradient), and after one step the weights differ by exactly −lr·wd·W0.
    w0, g = randn(8, 5, seed=3, dtype=F64), randn(8, 5, seed=4, dtype=F64)
    lr, wd = 0.01, 0.5
    out = {}
    for decay in (0.0, wd):
        w = nn.Parameter(w0.clone())
        opt = NesterovSinkhorn([w], lr=lr, weight_decay=decay)
        w.grad = g.clone()
        opt.step()
        out[decay] = (w.detach().clone(), opt.state[w]["momentum_buffer"].clone())
    assert torch.equal(out[0.0][1], out[wd][1])
    torch.testing.assert_close(out[wd][0] - out[0.0][0], -lr * wd * w0, rtol=0, atol=1e-15)


def test_lr_zero_leaves_the_matrix_bit_identical():
    w = nn.Parameter(randn(16, 8, seed=5))
    before = w.detach().clone()
    opt = NesterovSinkhorn([w], lr=0.0, weight_decay=0.1)
    for s in range(3):
        w.grad = randn(16, 8, seed=6, step=s)
        opt.step()
    assert torch.equal(w.detach().view(torch.int32), before.view(torch.int32))
    assert opt.state[w]["momentum_buffer"].abs().sum() > 0  # the step ran


def test_refuses_non_matrices_naming_the_shape():
    for shape in [(5,), (4, 1, 3), ()]:
        with pytest.raises(ValueError, match=rf"shape {re_shape(shape)}"):
            NesterovSinkhorn([nn.Parameter(torch.zeros(shape))], lr=0.1)


def re_shape(shape) -> str:
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


def test_state_dict_round_trip():
    w = nn.Parameter(randn(4, 6, seed=7))
    opt = NesterovSinkhorn([w], lr=0.05, weight_decay=0.1)
    for s in range(2):
        w.grad = randn(4, 6, seed=8, step=s)
        opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    w2 = nn.Parameter(w.detach().clone())
    opt2 = NesterovSinkhorn([w2], lr=0.05, weight_decay=0.1)
    opt2.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    assert torch.equal(opt2.state[w2]["momentum_buffer"], opt.state[w]["momentum_buffer"])
    g = randn(4, 6, seed=8, step=2)
    w.grad, w2.grad = g.clone(), g.clone()
    opt.step()
    opt2.step()
    assert torch.equal(w, w2)


def test_momentum_buffers_are_views_of_one_stack_per_shape_and_survive_a_load_and_a_missing_gradient():
    # One stack per shape group (one pass updates it); a loaded state (separate tensors) and a step where
    # one matrix has no gradient (the group changes) each rebuild it by a copy, the buffers' values kept:
    # the weights end bit for bit where an optimizer that never rebuilt would put them.
    shapes = [(3, 4), (5, 2), (3, 4)]
    w0 = [randn(*s, seed=50 + i) for i, s in enumerate(shapes)]
    grads = [[randn(*s, seed=60 + i, step=k) for i, s in enumerate(shapes)] for k in range(4)]

    def run(reload: bool):
        ws = [nn.Parameter(w.clone()) for w in w0]
        opt = NesterovSinkhorn(ws, lr=0.1, weight_decay=0.05)
        for k in range(4):
            for i, w in enumerate(ws):
                w.grad = None if (k == 2 and i == 2) else grads[k][i].clone()  # step 2: no gradient for w2
            opt.step()
            bufs = [opt.state[w]["momentum_buffer"] for w in ws]
            if k != 2:  # every matrix stepped: the two 3x4 buffers are views of one [2, 3, 4] stack
                assert bufs[0]._base is bufs[2]._base and bufs[0]._base.shape == (2, 3, 4)
                assert bufs[1]._base.shape == (1, 5, 2)
            if reload and k == 1:
                saved = io.BytesIO()
                torch.save(opt.state_dict(), saved)
                opt = NesterovSinkhorn(ws, lr=0.1, weight_decay=0.05)
                opt.load_state_dict(torch.load(io.BytesIO(saved.getvalue())))
                assert opt.state[ws[0]]["momentum_buffer"]._base is None  # separate tensors until the next step
        return [w.detach() for w in ws]

    def alone(i):  # matrix i in an optimizer of its own, skipping the step it has no gradient in
        w = nn.Parameter(w0[i].clone())
        opt = NesterovSinkhorn([w], lr=0.1, weight_decay=0.05)
        for k in range(4):
            if not (k == 2 and i == 2):
                w.grad = grads[k][i].clone()
                opt.step()
        return w.detach()

    straight, reloaded = run(False), run(True)
    for i in range(3):
        assert torch.equal(straight[i], reloaded[i]), i
        torch.testing.assert_close(straight[i], alone(i), rtol=0, atol=1e-6)


# ---- the update scale: why the matrices' lr is lr · 1.0 ----


def update_rms(make_opt, grads, shape) -> list[float]:
    """Entry RMS of (W_before − W_after) / lr at each step."""
    w = nn.Parameter(torch.zeros(shape))
    opt, lr = make_opt(w), 1e-3
    out = []
    for g in grads:
        before = w.detach().clone()
        w.grad = g.clone()
        opt.step()
        out.append(((before - w.detach()) / lr).pow(2).mean().sqrt().item())
    return out


def test_update_rms_sinkhorn_vs_adamw():
    # Measured (128×64, lr 1e-3, no decay), at steps 1 / 5 / 10 / 100:
    #   constant gradient   AdamW 1.000 1.000 1.000 1.000   NesterovSinkhorn 1.000 throughout
    #   i.i.d. N(0,1) noise AdamW 1.000 0.453 0.326 0.223   (steady state √((1−β1)/(1+β1)) = 0.229)
    #   G + 3·noise         AdamW 1.000 0.511 0.417 0.355
    # A Sinkhorn update has RMS 1 by construction; AdamW's is 1 for a consistent gradient and falls
    # towards 0.23 as the gradient becomes noise. --sinkhorn-lr-scale 1.0 (the default) matches the first regime; in
    # a noise-dominated one the matrices take steps up to ~4× AdamW's at the same lr.
    shape = (128, 64)
    G = randn(*shape, seed=9)
    noise = [randn(*shape, seed=10, step=s) for s in range(100)]
    adamw = lambda w: torch.optim.AdamW([w], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)  # noqa: E731
    sink = lambda w: NesterovSinkhorn([w], lr=1e-3)  # noqa: E731
    at = [0, 4, 9, 99]
    for grads in ([G] * 100, noise, [G + 3 * n for n in noise]):
        s = update_rms(sink, grads, shape)
        assert max(abs(v - 1) for v in s) < 1e-6
    a_const = update_rms(adamw, [G] * 100, shape)
    assert all(abs(a_const[i] - 1) < 1e-3 for i in at)
    a_noise = [update_rms(adamw, noise, shape)[i] for i in at]
    assert a_noise == pytest.approx([1.0, 0.453, 0.326, 0.223], abs=0.005)
    a_mix = [update_rms(adamw, [G + 3 * n for n in noise], shape)[i] for i in at]
    assert a_mix == pytest.approx([1.0, 0.511, 0.417, 0.355], abs=0.005)


# ---- the Optimizers wrapper (build_optimizers) ----


class Toy(nn.Module):
    """Every kind of parameter the policy places: embedding, hidden matrix, head, gain, bias, conv, A_log."""

    def __init__(self):
        super().__init__()
        gen = rng.generator(0, 0, "init")
        self.emb = nn.Embedding(32, 8)
        self.up = nn.Linear(8, 16)
        self.conv = nn.Conv1d(16, 16, 3, padding=1, groups=16, bias=False)
        self.down = nn.Linear(16, 8, bias=False)
        self.gain = nn.Parameter(torch.ones(8))
        self.A_log = nn.Parameter(torch.zeros(2))
        self.head = nn.Linear(8, 32, bias=False)
        self.head._dormouse_route = "adamw_decay"
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))

    def forward(self, ids):
        h = self.up(self.emb(ids))  # [B, T, 16]
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        h = self.down(torch.tanh(h)) * self.gain * self.A_log.exp().mean()
        return self.head(h)


def toy_loss(model: Toy, step: int) -> torch.Tensor:
    ids = torch.randint(0, 32, (2, 9), generator=rng.generator(0, step, "test"))
    logits = model(ids[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, 32), ids[:, 1:].reshape(-1))


def train(model, opts, steps, cfg, start=0):
    for s in range(start, start + steps):
        opts.set_lr(lr_multiplier(s, cfg))
        opts.zero_grad()
        toy_loss(model, s).backward()
        opts.step()


def cfg(**kw) -> TrainConfig:
    base = {"lr": 0.01, "weight_decay": 0.1, "warmup_steps": 2, "steps": 5, "lr_decay": "cosine", "lr_floor": 0.1}
    return TrainConfig(**{**base, **kw})


def test_build_optimizers_wiring():
    model = Toy()
    opts = build_optimizers(route(model), cfg(lr=0.02, weight_decay=0.3))
    adamw, sink = opts.optimizers["adamw"], opts.optimizers["matrices"]
    assert isinstance(adamw, torch.optim.AdamW) and isinstance(sink, NesterovSinkhorn)
    assert adamw.defaults["betas"] == (0.9, 0.95) and adamw.defaults["eps"] == 1e-8
    assert adamw.defaults["fused"] is False
    assert [(pg["name"], pg["weight_decay"], len(pg["params"])) for pg in adamw.param_groups] == [
        ("adamw_decay", 0.3, 2),
        ("adamw_no_decay", 0.0, 4),
    ]
    assert [(pg["name"], pg["weight_decay"], pg["momentum"], pg["iters"]) for pg in sink.param_groups] == [
        ("matrices", 0.3, 0.95, 5)
    ]
    assert opts.lrs() == {"adamw_decay": 0.02, "adamw_no_decay": 0.02, "matrices": 0.02}
    opts.set_lr(0.25)
    assert opts.lrs() == {"adamw_decay": 0.005, "adamw_no_decay": 0.005, "matrices": 0.005}
    scaled = build_optimizers(route(model), cfg(lr=0.02, sinkhorn_lr_scale=0.05))
    assert scaled.lrs()["matrices"] == pytest.approx(0.001) and scaled.lrs()["adamw_decay"] == 0.02


def test_lr_zero_leaves_every_parameter_bit_identical():
    model = Toy()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opts = build_optimizers(route(model), cfg(lr=0.0, weight_decay=0.1))
    for s in range(3):
        opts.zero_grad()
        toy_loss(model, s).backward()
        opts.step()
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n
        assert torch.equal(p.detach().view(torch.int32), before[n].view(torch.int32)), n
    # ... and a non-zero lr moves every one of them (the check is not vacuous).
    build_optimizers(route(model), cfg(lr=0.01)).step()
    assert all(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


def test_optimizers_state_dict_resume_is_bitwise():
    c = cfg(steps=5, warmup_steps=2)
    straight = Toy()
    opts = build_optimizers(route(straight), c)
    train(straight, opts, 5, c)

    first = Toy()
    opts1 = build_optimizers(route(first), c)
    train(first, opts1, 3, c)
    buf = io.BytesIO()
    torch.save({"model": first.state_dict(), "opt": opts1.state_dict()}, buf)

    saved = torch.load(io.BytesIO(buf.getvalue()))
    resumed = Toy()
    resumed.load_state_dict(saved["model"])
    opts2 = build_optimizers(route(resumed), c)
    opts2.load_state_dict(saved["opt"])
    train(resumed, opts2, 2, c, start=3)
    for (n, a), (_, b) in zip(straight.named_parameters(), resumed.named_parameters(), strict=True):
        assert torch.equal(a.detach().view(torch.int32), b.detach().view(torch.int32)), n
    assert not torch.equal(straight.up.weight, first.up.weight)  # the last 2 steps did something


def test_optimizers_load_refuses_another_layout():
    model = Toy()
    state = build_optimizers(route(model), cfg()).state_dict()
    other = build_optimizers(route(model, opt="adamw"), cfg())
    with pytest.raises(
        ValueError,
        match="layout matrices: 2 tensors, adamw_decay: 2 tensors, adamw_no_decay: 4 tensors; "
        "this model routes to adamw_decay: 4",
    ):
        other.load_state_dict(state)


def test_config_wins_over_saved_hyperparameters():
    # The state dict resumes moments; lr and weight decay are the current config's.
    model = Toy()
    old = build_optimizers(route(model), cfg(lr=0.01, weight_decay=0.1))
    train(model, old, 1, cfg())
    new = build_optimizers(route(model), cfg(lr=0.5, weight_decay=0.0))
    new.load_state_dict(old.state_dict())
    assert new.lrs() == dict.fromkeys(["adamw_decay", "adamw_no_decay", "matrices"], 0.5)
    assert all(pg["weight_decay"] == 0.0 for o in new.optimizers.values() for pg in o.param_groups)
    assert new.optimizers["adamw"].state[model.emb.weight]["step"].item() == 1.0


def test_sparse_group_goes_to_sparse_row_adam_under_both_policies():
    from dormouse.train.sparse import SparseRowAdam

    for opt in ("sinkhorn", "adamw"):
        model = Toy()
        model.emb._dormouse_route = "sparse"
        opts = build_optimizers(route(model, opt), cfg())
        assert isinstance(opts.optimizers["sparse"], SparseRowAdam)
        assert [p for pg in opts.optimizers["sparse"].param_groups for p in pg["params"]] == [model.emb.weight]
        assert opts.optimizers["sparse"].param_groups[0]["weight_decay"] == 0.0


# ---- schedule ----


def test_schedule_pinned_values():
    # warm-up 10, 111 steps: the decay runs over steps 10 .. 110 (p = (step − 10) / 100), floor 0.1.
    c = {
        kind: cfg(warmup_steps=10, steps=111, lr_floor=0.1, lr_decay=kind) for kind in ("cosine", "linear", "constant")
    }
    for kind in c:
        assert [lr_multiplier(s, c[kind]) for s in (0, 4, 9)] == [1 / 11, 5 / 11, 10 / 11]
        assert lr_multiplier(10, c[kind]) == 1.0
    cos_q = 0.1 + 0.45 * (1 + math.sqrt(0.5))  # p = 1/4
    assert [lr_multiplier(s, c["cosine"]) for s in (35, 60, 85)] == pytest.approx([cos_q, 0.55, 1.1 - cos_q], abs=1e-12)
    assert [lr_multiplier(s, c["linear"]) for s in (35, 60, 85)] == pytest.approx([0.775, 0.55, 0.325], abs=1e-12)
    assert [lr_multiplier(s, c["constant"]) for s in (35, 110, 500)] == [1.0, 1.0, 1.0]
    # The last update (step = steps − 1) is taken at exactly lr_floor, and it stays there.
    for kind in ("cosine", "linear"):
        assert lr_multiplier(110, c[kind]) == 0.1 and lr_multiplier(500, c[kind]) == 0.1


def test_schedule_monotone_and_edges():
    for kind in ("cosine", "linear"):
        c = cfg(warmup_steps=7, steps=50, lr_floor=0.2, lr_decay=kind)
        m = [lr_multiplier(s, c) for s in range(60)]
        assert all(a < b for a, b in zip(m[:7], m[1:8], strict=True))  # warm-up rises to the peak at step 7
        assert m[7] == 1.0 and max(m) == 1.0
        assert all(a >= b for a, b in zip(m[7:], m[8:], strict=False))  # never rises after the peak
        assert m[49] == 0.2 and min(m[7:]) == 0.2
    assert lr_multiplier(0, cfg(warmup_steps=0, steps=10)) == 1.0  # no warm-up: the first step is the peak
    # A warm-up longer than the run: every step is warm-up, nothing decays.
    short = cfg(warmup_steps=10, steps=5)
    assert [lr_multiplier(s, short) for s in range(5)] == [k / 11 for k in range(1, 6)]
    assert lr_multiplier(10, short) == 1.0
    with pytest.raises(ValueError, match="step must be >= 0"):
        lr_multiplier(-1, short)
    with pytest.raises(ValueError, match="unknown lr_decay 'exp'"):
        lr_multiplier(0, cfg(lr_decay="exp"))
