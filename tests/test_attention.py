import math

import pytest
import torch

from dormouse import rng
from dormouse.model.attention import CausalSelfAttention, rotary


def init(seed: int = 0) -> torch.Generator:
    return rng.generator(seed, 0, "init")


def randn(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=rng.generator(seed, 0, "test"), dtype=dtype)


def make(seed: int = 0, d: int = 16, heads: int = 2, head_dim: int = 8, qk_norm: bool = False) -> CausalSelfAttention:
    attn = CausalSelfAttention(d, heads, head_dim, generator=init(seed), qk_norm=qk_norm)
    with torch.no_grad():  # larger than the N(0, 0.02) init so the softmax is far from uniform
        for p in attn.parameters():
            p.mul_(15)
        if qk_norm:  # gains other than 15 everywhere: each channel's own gain must be the one applied
            attn.q_norm.weight.mul_(torch.linspace(0.5, 1.5, head_dim))
            attn.k_norm.weight.mul_(torch.linspace(1.5, 0.5, head_dim))
    return attn


def rms_ref(vec: list[float], gain: list[float], eps: float = 1e-6) -> list[float]:
    scale = 1 / math.sqrt(sum(a * a for a in vec) / len(vec) + eps)
    return [a * scale * g for a, g in zip(vec, gain, strict=True)]


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
    """softmax(q·k/√D over s ≤ t) v per (batch, head, position), python floats, then o_proj; with QK-norm,
    q and k are each RMS-normalised per head (times the norm's gains) before the rotation."""
    bsz, t_len, _ = x.shape
    heads, dim = attn.n_heads, attn.head_dim
    wq, wk, wv, wo = (p.weight.double() for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
    mixed = torch.zeros(bsz, t_len, heads * dim, dtype=torch.float64)
    for b in range(bsz):
        proj = [(wq @ x[b, t].double(), wk @ x[b, t].double(), wv @ x[b, t].double()) for t in range(t_len)]
        for h in range(heads):
            sl = slice(h * dim, (h + 1) * dim)
            qs, ks = [proj[t][0][sl].tolist() for t in range(t_len)], [proj[t][1][sl].tolist() for t in range(t_len)]
            if attn.q_norm is not None:
                qs = [rms_ref(q, attn.q_norm.weight.tolist(), attn.q_norm.eps) for q in qs]
                ks = [rms_ref(k, attn.k_norm.weight.tolist(), attn.k_norm.eps) for k in ks]
            qs = [rope_ref(q, t) for t, q in enumerate(qs)]
            ks = [rope_ref(k, t) for t, k in enumerate(ks)]
            vs = [proj[t][2][sl] for t in range(t_len)]
            for t in range(t_len):
                scores = [sum(a * b for a, b in zip(qs[t], ks[s], strict=True)) / math.sqrt(dim) for s in range(t + 1)]
                e = [math.exp(sc - max(scores)) for sc in scores]
                mixed[b, t, sl] = sum(e[s] / sum(e) * vs[s] for s in range(t + 1))
    return mixed @ wo.T


@pytest.mark.parametrize("qk_norm", [False, True])
def test_construction_draws_nothing_from_the_global_rng_and_is_reproducible(qk_norm):
    state = torch.random.get_rng_state()
    a = CausalSelfAttention(16, 2, 8, generator=init(1), qk_norm=qk_norm)
    assert torch.equal(torch.random.get_rng_state(), state)
    with torch.no_grad():
        for p in a.parameters():
            p.zero_()
    a.reset_parameters(init(1))
    b = CausalSelfAttention(16, 2, 8, generator=init(1), qk_norm=qk_norm)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if name.endswith("_norm.weight"):
            assert torch.equal(pa, torch.ones(8)), name
        else:
            assert 0.015 < pa.std().item() < 0.025, name


@pytest.mark.parametrize("qk_norm", [False, True])
def test_forward_matches_float64_loop_reference(qk_norm):
    attn = make(1, d=12, heads=3, head_dim=6, qk_norm=qk_norm).double()
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


@pytest.mark.parametrize("qk_norm", [False, True])
def test_steps_equal_full_forward(qk_norm):
    attn = make(2, qk_norm=qk_norm)
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


@pytest.mark.parametrize("qk_norm", [False, True])
def test_gradients_reach_every_projection_and_match_central_differences(qk_norm):
    attn = make(5, d=8, heads=2, head_dim=4, qk_norm=qk_norm).double()
    x = randn(1, 5, 8, seed=8, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(attn, (x,), eps=1e-6, atol=1e-8)
    attn(x).pow(2).sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad.abs().min() > 0, name


def test_odd_head_dim_is_refused():
    with pytest.raises(ValueError, match="head_dim=5"):
        CausalSelfAttention(10, 2, 5, generator=init())
