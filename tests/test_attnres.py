import pytest
import torch
from torch.func import functional_call

from dormouse import rng
from dormouse.model.attnres import AttnRes
from dormouse.model.norm import RMSNorm

F64 = torch.float64


def init(seed: int = 0) -> torch.Generator:
    return rng.generator(seed, 0, "init")


def randn(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=rng.generator(seed, 0, "test"), dtype=dtype)


def sources(n: int, seed: int, shape=(2, 5, 8), dtype=torch.float32) -> list[torch.Tensor]:
    # Different scales per source, so RMSNorm of the keys matters.
    return [randn(*shape, seed=seed + i, dtype=dtype) * (1 + i) for i in range(n)]


def randomised(attnres: AttnRes, seed: int) -> AttnRes:
    with torch.no_grad():
        attnres.w.copy_(randn(attnres.w.shape[0], seed=seed))
        attnres.norm.weight.copy_(1 + 0.5 * randn(attnres.w.shape[0], seed=seed + 1))
    return attnres


def attnres_ref(w, gain, eps, vs):
    """Σ_i softmax_i(w · gain ⊙ v_i / sqrt(mean(v_i²) + eps)) v_i, float64, per token."""
    vs = [v.double() for v in vs]
    logits = [((v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)) * gain.double()) @ w.double() for v in vs]
    top = torch.stack(logits).max(0).values
    e = [torch.exp(lg - top) for lg in logits]
    z = sum(e)
    mix = sum((ei / z).unsqueeze(-1) * v for ei, v in zip(e, vs, strict=True))
    return mix, torch.stack([ei / z for ei in e])


def test_uses_the_project_rmsnorm_and_starts_at_zero():
    state = torch.random.get_rng_state()
    a = AttnRes(8, eps=1e-6, generator=init())
    assert torch.equal(torch.random.get_rng_state(), state)
    assert type(a.norm) is RMSNorm and a.norm.eps == 1e-6
    assert torch.equal(a.w, torch.zeros(8)) and torch.equal(a.norm.weight, torch.ones(8))
    randomised(a, 1)
    a.reset_parameters(init())  # a reset puts the query back to exactly zero, the gain to one
    assert torch.equal(a.w, torch.zeros(8)) and torch.equal(a.norm.weight, torch.ones(8))


def test_zero_query_gives_the_mean_of_the_sources():
    a = AttnRes(8, eps=1e-6, generator=init())
    vs = sources(3, seed=0, dtype=F64)
    torch.testing.assert_close(a(vs), (vs[0] + vs[1] + vs[2]) / 3, rtol=0, atol=1e-15)
    assert torch.equal(a.weights(vs), torch.full((3, 2, 5), 1 / 3, dtype=F64))
    vs32 = sources(4, seed=0)
    torch.testing.assert_close(a(vs32), torch.stack(vs32).mean(0), rtol=0, atol=1e-6)


def test_one_source_is_returned_unchanged():
    a = randomised(AttnRes(8, eps=1e-6, generator=init()), 2)
    (v,) = sources(1, seed=3)
    assert a([v]) is v
    assert torch.equal(a.weights([v]), torch.ones(1, 2, 5))
    with pytest.raises(ValueError, match="at least one source"):
        a([])


@pytest.mark.parametrize("n", [2, 5])
def test_matches_float64_formula_with_random_query_and_gain(n):
    a = randomised(AttnRes(8, eps=1e-3, generator=init()), 4)
    vs = sources(n, seed=10, dtype=F64)
    ref, ref_w = attnres_ref(a.w, a.norm.weight, 1e-3, vs)
    got = a.double()(vs)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-13)
    torch.testing.assert_close(a.weights(vs), ref_w, rtol=0, atol=1e-14)
    assert ref_w.max() > 0.9 or ref_w.min() < 0.5 / n  # the mix is far from uniform here
    # fp32 sources: computed in fp32, returned in fp32
    a32 = randomised(AttnRes(8, eps=1e-3, generator=init()), 4)
    vs32 = [v.float() for v in vs]
    out = a32(vs32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-5)


def test_bf16_sources_come_back_bf16_and_decode_shape_works():
    a = randomised(AttnRes(8, eps=1e-6, generator=init()), 5)
    vs = sources(3, seed=20)
    out = a([v.bfloat16() for v in vs])
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), a(vs), rtol=2e-2, atol=2e-2)
    # a decode step feeds [B, d] sources: the same function of each position
    step = a([v[:, 3] for v in vs])
    torch.testing.assert_close(step, a(vs)[:, 3], rtol=0, atol=1e-6)


def test_gradients_reach_query_gain_and_every_source():
    a = randomised(AttnRes(8, eps=1e-6, generator=init()), 6)
    vs = [v.requires_grad_() for v in sources(4, seed=30)]
    (a(vs) * randn(2, 5, 8, seed=40)).sum().backward()
    assert a.w.grad.abs().min() > 0
    assert a.norm.weight.grad.abs().min() > 0
    for i, v in enumerate(vs):
        assert v.grad.abs().min() > 0, i
    # at init (w = 0) the query still receives a gradient, so it can leave the uniform mix
    fresh = AttnRes(8, eps=1e-6, generator=init())
    (fresh([v.detach() for v in vs]) * randn(2, 5, 8, seed=40)).sum().backward()
    assert fresh.w.grad.abs().sum() > 0


def test_gradients_match_central_differences():
    a = randomised(AttnRes(4, eps=1e-6, generator=init()), 7).double()
    w = a.w.detach().clone().requires_grad_()
    gain = a.norm.weight.detach().clone().requires_grad_()
    vs = [v.requires_grad_() for v in sources(3, seed=50, shape=(2, 3, 4), dtype=F64)]

    def f(w, gain, *vs):
        return functional_call(a, {"w": w, "norm.weight": gain}, (list(vs),))

    assert torch.autograd.gradcheck(f, (w, gain, *vs), eps=1e-6, atol=1e-8)
