import math

import pytest
import torch

from dormouse import rng
from dormouse.model.attention import CausalSelfAttention, rotary


def init(seed: int = 0) -> torch.Generator:
    return rng.generator(seed, 0, "init")


def randn(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=rng.generator(seed, 0, "test"), dtype=dtype)


def make(seed: int = 0, d: int = 16, heads: int = 2, head_dim: int = 8) -> CausalSelfAttention:
    attn = CausalSelfAttention(d, heads, head_dim, generator=init(seed))
    with torch.no_grad():  # larger than the N(0, 0.02) init so the softmax is far from uniform
        for p in attn.parameters():
            p.mul_(15)
    return attn


def rope_ref(vec: list[float], pos: int) -> list[float]:
    """Rotate channel i with channel i + D/2 by pos · 10000^(-2i/D)."""
    half = len(vec) // 2
    out = list(vec)
    for i in range(half):
        theta = pos * 10000.0 ** (-2 * i / len(vec))
        a, b = vec[i], vec[i + half]
        out[i] = a * math.cos(theta) - b * math.sin(theta)
        out[i + half] = b * math.cos(theta) + a * math.sin(theta)
    return out


@torch.no_grad()
def attention_ref(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """softmax(q·k/√D over s ≤ t) v per (batch, head, position), python floats, then o_proj."""
    bsz, t_len, _ = x.shape
    heads, dim = attn.n_heads, attn.head_dim
    wq, wk, wv, wo = (p.weight.double() for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
    mixed = torch.zeros(bsz, t_len, heads * dim, dtype=torch.float64)
    for b in range(bsz):
        proj = [(wq @ x[b, t].double(), wk @ x[b, t].double(), wv @ x[b, t].double()) for t in range(t_len)]
        for h in range(heads):
            sl = slice(h * dim, (h + 1) * dim)
            qs = [rope_ref(proj[t][0][sl].tolist(), t) for t in range(t_len)]
            ks = [rope_ref(proj[t][1][sl].tolist(), t) for t in range(t_len)]
            vs = [proj[t][2][sl] for t in range(t_len)]
            for t in range(t_len):
                scores = [sum(a * b for a, b in zip(qs[t], ks[s], strict=True)) / math.sqrt(dim) for s in range(t + 1)]
                e = [math.exp(sc - max(scores)) for sc in scores]
                mixed[b, t, sl] = sum(e[s] / sum(e) * vs[s] for s in range(t + 1))
    return mixed @ wo.T


def test_construction_draws_nothing_from_the_global_rng_and_is_reproducible():
    state = torch.random.get_rng_state()
    a = CausalSelfAttention(16, 2, 8, generator=init(1))
    assert torch.equal(torch.random.get_rng_state(), state)
    with torch.no_grad():
        for p in a.parameters():
            p.zero_()
    a.reset_parameters(init(1))
    b = CausalSelfAttention(16, 2, 8, generator=init(1))
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        assert 0.015 < pa.std().item() < 0.025, name


def test_forward_matches_float64_loop_reference():
    attn = make(1, d=12, heads=3, head_dim=6).double()
    x = randn(2, 7, 12, seed=1, dtype=torch.float64)
    torch.testing.assert_close(attn(x), attention_ref(attn, x), rtol=0, atol=1e-12)


def test_rotary_is_a_rotation_with_relative_scores():
    # Scores depend on the position difference only: q_m·k_n == rot(q, m+s)·rot(k, n+s).
    q, k = randn(1, 1, 1, 8, seed=2, dtype=torch.float64), randn(1, 1, 1, 8, seed=3, dtype=torch.float64)
    base = (rotary(q, 5) * rotary(k, 2)).sum()
    shifted = (rotary(q, 105) * rotary(k, 102)).sum()
    torch.testing.assert_close(shifted, base, rtol=0, atol=1e-12)
    torch.testing.assert_close(rotary(q, 7).norm(), q.norm(), rtol=0, atol=1e-12)
    assert torch.equal(rotary(q, 0), q)


def test_steps_equal_full_forward():
    attn = make(2)
    x = randn(2, 12, 16, seed=4)
    full = attn(x)
    cache, ys = None, []
    for t in range(12):
        y, cache = attn.step(x[:, t], cache)
        ys.append(y)
    assert cache.length == 12
    torch.testing.assert_close(torch.stack(ys, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("k", [1, 5])
def test_prefill_then_steps_and_chunks_equal_full_forward(k):
    attn = make(3)
    x = randn(2, 12, 16, seed=5)
    full = attn(x)
    y, cache = attn(x[:, :k], return_cache=True)
    torch.testing.assert_close(y, full[:, :k], rtol=0, atol=1e-6)
    ys = [y]
    for t in range(k, 9):
        y, cache = attn.step(x[:, t], cache)
        ys.append(y[:, None])
    y, cache = attn(x[:, 9:], cache, return_cache=True)  # a multi-position continuation of a cache
    ys.append(y)
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(ys, dim=1), full, rtol=0, atol=1e-5)


def test_causality_is_exact():
    attn = make(4)
    x = randn(2, 10, 16, seed=6)
    y = attn(x)
    for t in (0, 4, 8):
        x2 = x.clone()
        x2[:, t + 1 :] += randn(2, 9 - t, 16, seed=7 + t)
        y2 = attn(x2)
        assert torch.equal(y2[:, : t + 1], y[:, : t + 1])
        assert not torch.allclose(y2[:, t + 1 :], y[:, t + 1 :])


def test_gradients_reach_every_projection_and_match_central_differences():
    attn = make(5, d=8, heads=2, head_dim=4).double()
    x = randn(1, 5, 8, seed=8, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(attn, (x,), eps=1e-6, atol=1e-8)
    attn(x).pow(2).sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad.abs().min() > 0, name


def test_odd_head_dim_is_refused():
    with pytest.raises(ValueError, match="head_dim=5"):
        CausalSelfAttention(10, 2, 5, generator=init())
