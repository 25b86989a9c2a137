import math

import pytest
import torch
from torch.func import functional_call

from dormouse import rng
from dormouse.model.ffn import MoE, SwiGLU, balance_term, make_ffn

F64 = torch.float64


def init(seed: int = 0) -> torch.Generator:
    return rng.generator(seed, 0, "init")


def randn(*shape, seed: int = 0, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=rng.generator(seed, 0, "test"), dtype=dtype)


def swiglu_ref(ffn: SwiGLU, x: torch.Tensor) -> torch.Tensor:
    """One token `[d]`, float64, written out: w_down (silu(w_gate x) * w_up x)."""
    a = ffn.w_gate.weight.double() @ x
    u = ffn.w_up.weight.double() @ x
    return ffn.w_down.weight.double() @ (a / (1 + torch.exp(-a)) * u)


@torch.no_grad()
def moe_ref(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, list[list[int]]]:
    """Per-token loop in float64: softmax router, top-k by sorting, renormalised weights (raw for k=1)."""
    flat = x.reshape(-1, x.shape[-1]).double()
    out, chosen = torch.zeros_like(flat), []
    for n in range(flat.shape[0]):
        logits = [float(v) for v in moe.router.weight.double() @ flat[n]]
        z = sum(math.exp(v - max(logits)) for v in logits)
        p = [math.exp(v - max(logits)) / z for v in logits]
        top = sorted(range(moe.n_experts), key=lambda i: -p[i])[: moe.top_k]
        total = sum(p[i] for i in top) if moe.top_k > 1 else 1.0
        for i in top:
            out[n] += p[i] / total * swiglu_ref(moe.experts[i], flat[n])
        chosen.append(top)
    return out.reshape(x.shape), chosen


def test_construction_draws_nothing_from_the_global_rng_and_is_reproducible():
    state = torch.random.get_rng_state()
    a = make_ffn(16, 32, 4, 2, init(3))
    b = make_ffn(16, 32, 4, 2, init(3))
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        assert 0.015 < pa.std().item() < 0.025, name  # N(0, 0.02)
    c = make_ffn(16, 32, 4, 2, init(4))
    assert not torch.equal(a.router.weight, c.router.weight)
    with torch.no_grad():
        for p in a.parameters():
            p.zero_()
    a.reset_parameters(init(3))  # a reset from the same stream reproduces the constructed weights
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name


def test_swiglu_matches_hand_written_formula():
    ffn = SwiGLU(8, 24, generator=init()).double()
    x = randn(2, 5, 8)
    y, aux = ffn(x)
    assert aux == {}
    ref = torch.stack([swiglu_ref(ffn, x[b, t]) for b in range(2) for t in range(5)]).reshape(2, 5, 8)
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-14)


def swiglu_grads(ffn: SwiGLU, x: torch.Tensor, r: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of Σ r·ffn(x) over tokens x, r `[N, d]`, float64, derived by hand: h = silu(a)·u with
    a = W_gate x, u = W_up x; silu'(a) = σ(a)(1 + a(1 − σ(a)))."""
    wg, wu, wd = (w.detach().double() for w in (ffn.w_gate.weight, ffn.w_up.weight, ffn.w_down.weight))
    a, u = x @ wg.T, x @ wu.T
    s = 1 / (1 + torch.exp(-a))
    dh = r @ wd
    da, du = dh * u * s * (1 + a * (1 - s)), dh * a * s
    return {
        "x": da @ wg + du @ wu,
        "w_gate.weight": da.T @ x,
        "w_up.weight": du.T @ x,
        "w_down.weight": r.T @ (a * s * u),
    }


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
def test_one_expert_is_the_dense_swiglu_in_outputs_and_gradients(dense):
    # make_ffn builds the plain SwiGLU for one expert, no router: exact because a mixture of one expert weighs
    # it by softmax of one logit = 1, and that weight's gradient (the router's) is 0. Same weights, float64.
    moe = MoE(8, 24, 1, 1, generator=init(1), dense=dense).double()
    ffn = make_ffn(8, 24, 1, 1, init(2))
    assert type(ffn) is SwiGLU and not any("router" in name for name, _ in ffn.named_parameters())
    ffn.double().load_state_dict(moe.experts[0].state_dict())
    x, r = randn(10, 8, seed=1), randn(10, 8, seed=2)
    want = swiglu_grads(moe.experts[0], x, r)
    ref = torch.stack([swiglu_ref(moe.experts[0], x[n]) for n in range(10)])
    for module, expert in ((moe, moe.experts[0]), (ffn, ffn)):
        xg = x.clone().requires_grad_()
        y, aux = module(xg)
        torch.testing.assert_close(y, ref, rtol=0, atol=1e-13)
        if module is moe:
            assert aux["moe_balance"].item() == 1.0  # f = P = 1
            ((y * r).sum() + aux["moe_balance"]).backward()
        else:
            assert aux == {}
            (y * r).sum().backward()
        torch.testing.assert_close(xg.grad, want["x"], rtol=0, atol=1e-12)
        for name, p in expert.named_parameters():
            torch.testing.assert_close(p.grad, want[name], rtol=0, atol=1e-12, msg=name)
    assert moe.router.weight.grad.abs().max().item() == 0.0
    assert isinstance(make_ffn(8, 24, 3, 2, init(1)), MoE)


@pytest.mark.parametrize("n_experts,top_k", [(4, 2), (3, 1), (3, 3)])
def test_moe_matches_per_token_loop(n_experts, top_k):
    moe = MoE(8, 16, n_experts, top_k, generator=init(2)).double()
    with torch.no_grad():  # a router large enough that the routing is far from uniform
        moe.router.weight.mul_(50)
    x = randn(3, 7, 8, seed=1)
    y, aux = moe(x)
    ref, chosen = moe_ref(moe, x)
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-13)
    counts = torch.bincount(torch.tensor([i for top in chosen for i in top]), minlength=n_experts)
    assert torch.equal(moe.pop_load(), counts)
    assert torch.equal(moe.load, torch.zeros(n_experts, dtype=torch.int64))
    # balance term from the same routing, written out
    probs = torch.softmax(x.reshape(-1, 8) @ moe.router.weight.T, dim=-1)
    f = counts.double() / (21 * top_k)
    expected = n_experts * sum(f[i] * probs[:, i].mean() for i in range(n_experts))
    torch.testing.assert_close(aux["moe_balance"], expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("n_experts,top_k", [(4, 2), (3, 1), (3, 3)])
def test_dense_dispatch_is_the_same_function_gradients_and_load(n_experts, top_k):
    # Every expert on every token, weighted 0 where not chosen: equal to the per-token loop and to the sparse
    # dispatch (the zero terms add nothing), with the same gradients for the router and every expert.
    sparse = MoE(8, 16, n_experts, top_k, generator=init(2)).double()
    dense = MoE(8, 16, n_experts, top_k, generator=init(2), dense=True).double()
    with torch.no_grad():
        for m in (sparse, dense):
            m.router.weight.mul_(50)
    x, r = randn(3, 7, 8, seed=1), randn(3, 7, 8, seed=2)
    outs = []
    for m in (sparse, dense):
        y, aux = m(x)
        ((y * r).sum() + aux["moe_balance"]).backward()
        outs.append((y, aux["moe_balance"], m.pop_load(), {n: p.grad for n, p in m.named_parameters()}))
    ref, chosen = moe_ref(dense, x)
    torch.testing.assert_close(outs[1][0], ref, rtol=0, atol=1e-13)
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=0, atol=1e-13)
    assert outs[1][1].item() == pytest.approx(outs[0][1].item(), abs=1e-14)
    counts = torch.bincount(torch.tensor([i for top in chosen for i in top]), minlength=n_experts)
    assert torch.equal(outs[0][2], counts) and torch.equal(outs[1][2], counts)
    for name, g in outs[0][3].items():
        torch.testing.assert_close(outs[1][3][name], g, rtol=0, atol=1e-12, msg=name)


def test_moe_accepts_any_leading_shape_and_accumulates_load():
    moe = MoE(8, 16, 4, 2, generator=init(2))
    x = randn(3, 7, 8, seed=1, dtype=torch.float32)
    y3, _ = moe(x)
    y2, _ = moe(x.reshape(21, 8))  # e.g. a decode step [B, d]
    torch.testing.assert_close(y2, y3.reshape(21, 8), rtol=0, atol=1e-6)
    assert moe.pop_load().sum().item() == 2 * 21 * 2


def test_balance_is_one_when_balanced_and_hand_computed_when_skewed():
    # Two experts, d=2, router rows ln3·e_i: token e_0 routes p = (3/4, 1/4) → expert 0, e_1 the mirror.
    moe = MoE(2, 4, 2, 1, generator=init())
    with torch.no_grad():
        moe.router.weight.copy_(math.log(3) * torch.eye(2))
    e0, e1 = [1.0, 0.0], [0.0, 1.0]
    _, aux = moe(torch.tensor([[e0, e1]]))
    assert aux["moe_balance"].item() == pytest.approx(1.0, abs=1e-6)
    # 3 tokens to expert 0, 1 to expert 1: f = (3/4, 1/4), P = (5/8, 3/8), 2·(15/32 + 3/32) = 1.125
    _, aux = moe(torch.tensor([[e0, e0, e0, e1]]))
    assert aux["moe_balance"].item() == pytest.approx(1.125, abs=1e-6)
    # all to expert 0: f = (1, 0), P = (3/4, 1/4) → 1.5
    _, aux = moe(torch.tensor([[e0, e0]]))
    assert aux["moe_balance"].item() == pytest.approx(1.5, abs=1e-6)
    # four experts, top-2: uniform probabilities and equal counts → 1; everything on experts 0,1 → E/k = 2
    uniform = torch.full((6, 4), 0.25)
    assert balance_term(uniform, torch.tensor([3, 3, 3, 3])).item() == pytest.approx(1.0)
    skew = torch.tensor([[0.5, 0.5, 0.0, 0.0]]).repeat(6, 1)
    assert balance_term(skew, torch.tensor([6, 6, 0, 0])).item() == pytest.approx(2.0)


def test_gradients_reach_the_router_and_every_expert_with_tokens():
    moe = MoE(8, 16, 4, 2, generator=init(5))
    x = randn(2, 16, 8, seed=2, dtype=torch.float32)
    r = randn(2, 16, 8, seed=3, dtype=torch.float32)
    y, aux = moe(x)
    ((y * r).sum() + aux["moe_balance"]).backward()
    load = moe.pop_load()
    assert (load > 0).all(), load  # every expert is exercised by this input
    assert moe.router.weight.grad.abs().min() > 0
    for e, expert in enumerate(moe.experts):
        for name, p in expert.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, (e, name)


def test_top1_router_learns_from_the_output_alone():
    # With k=1 the weight is the raw probability, so the LM loss reaches the router without the aux term.
    moe = MoE(8, 16, 3, 1, generator=init(5))
    y, _ = moe(randn(2, 16, 8, seed=2, dtype=torch.float32))
    (y * randn(2, 16, 8, seed=3, dtype=torch.float32)).sum().backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_moe_gradients_match_central_differences():
    moe = MoE(4, 6, 3, 2, generator=init(6)).double()
    with torch.no_grad():
        moe.router.weight.mul_(20)
    x = randn(5, 4, seed=4).requires_grad_()
    params = {"router.weight": moe.router.weight.detach().clone().requires_grad_()}
    params["experts.1.w_up.weight"] = moe.experts[1].w_up.weight.detach().clone().requires_grad_()

    def f(x, wr, wu):
        y, aux = functional_call(moe, {"router.weight": wr, "experts.1.w_up.weight": wu}, (x,))
        return y, aux["moe_balance"]

    assert torch.autograd.gradcheck(f, (x, *params.values()), eps=1e-6, atol=1e-8)


def test_top_k_larger_than_n_experts_is_refused():
    with pytest.raises(ValueError, match=r"top_k=3 with n_experts=2"):
        make_ffn(8, 16, 2, 3, init())
    with pytest.raises(ValueError, match=r"top_k=2 with n_experts=1"):
        make_ffn(8, 16, 1, 2, init())
    with pytest.raises(ValueError, match=r"top_k=5 with n_experts=4"):
        MoE(8, 16, 4, 5, generator=init())
    with pytest.raises(ValueError, match=r"n_experts=0"):
        make_ffn(8, 16, 0, 1, init())
