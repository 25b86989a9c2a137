"""KDA: the chunked form against the recurrence (values and gradients), the layer, the dispatch.

Errors are relative to the reference's scale: rel(x, ref) = max|x - ref| / max|ref|.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from backend_stand_in import force
from conv_stand_in import StandInKernels  # tests/conv_stand_in.py

from dormouse import counters, ledger, rng
from dormouse.model.kda_layer import KDA_PARAM_GROUPS, KDALayer
from dormouse.model.norm import GatedRMSNorm
from dormouse.ops import kda as kda_module
from dormouse.ops import registry
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.kda import kda
from dormouse.ops.kda.chunked import _bounded_chunk, _decayed_scores, kda_chunked
from dormouse.ops.kda.reference import decay, kda_recurrent
from dormouse.ops.norm.reference import l2norm
from dormouse.ops.short_conv import fused as conv_fused


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).abs().max() / ref.abs().max()).item()


def inputs(B, T, H, K, V, *, dtype=torch.float64, gate="soft", state=True, seed=0):
    """Random KDA inputs: q, k L2-normalised, g <= 0, beta in (0, 1), optional initial state."""
    gen = rng.generator(seed, 0, "test")

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = l2norm(randn(B, T, H, K)), l2norm(randn(B, T, H, K)), randn(B, T, H, V)
    if gate == "soft":
        g = -F.softplus(randn(B, T, H, K))
    else:  # strong: per-step log-decay anywhere in (-5, 0); a 64-chunk decays by up to e^-320
        g = -5 * torch.rand(B, T, H, K, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    h0 = randn(B, H, K, V) if state else None
    return tuple(None if x is None else x.to(dtype) for x in (q, k, v, g, beta, h0))


def make_layer(seed=0, d=32, H=2, K=8, **kw) -> KDALayer:
    return KDALayer(d, H, K, generator=rng.generator(seed, 0, "init"), **kw)


# --- gate 1: chunked == recurrent ------------------------------------------------------------------


@pytest.mark.parametrize("gate", ["soft", "strong"])
@pytest.mark.parametrize("state", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("T", [1, 37, 64, 130])
def test_chunked_matches_recurrent_fp64(T, chunk, state, gate):
    q, k, v, g, beta, h0 = inputs(2, T, 2, 16, 8, gate=gate, state=state)
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, s = kda_chunked(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=chunk)
    assert o.dtype == s.dtype == torch.float64
    assert rel(o, o_ref) <= 1e-10
    assert rel(s, s_ref) <= 1e-10


@pytest.mark.parametrize("gate", ["soft", "strong"])
@pytest.mark.parametrize("T,chunk", [(37, 16), (130, 64)])
def test_chunked_fp32_matches_fp64_recurrence(T, chunk, gate):
    args64 = inputs(2, T, 2, 16, 8, gate=gate)
    o_ref, s_ref = kda_recurrent(*args64[:5], initial_state=args64[5], output_final_state=True)
    q, k, v, g, beta, h0 = (x.float() for x in args64)
    o, s = kda_chunked(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=chunk)
    assert o.dtype == s.dtype == torch.float32
    assert rel(o.double(), o_ref) <= 1e-4
    assert rel(s.double(), s_ref) <= 1e-4


def test_chunked_extreme_decay_stays_finite_in_fp32():
    """g down to -40 a step: any exp of a positive in-chunk exponent would overflow fp32 (> e^88)."""
    q, k, v, g, beta, h0 = inputs(2, 100, 2, 16, 8, gate="strong")
    g = 8 * g
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    args = [x.float().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, s = kda_chunked(*args[:5], initial_state=args[5], output_final_state=True)
    assert rel(o.double(), o_ref) <= 1e-4
    assert rel(s.double(), s_ref) <= 1e-4
    grads = torch.autograd.grad(o.sum() + s.sum(), args)
    assert all(torch.isfinite(gr).all() for gr in grads)


def test_chunked_scale_and_no_final_state():
    q, k, v, g, beta, h0 = inputs(1, 20, 2, 8, 4)
    o_ref, _ = kda_recurrent(q, k, v, g, beta, scale=0.3, initial_state=h0)
    o, s = kda_chunked(q, k, v, g, beta, scale=0.3, initial_state=h0, chunk_size=16)
    assert s is None
    assert rel(o, o_ref) <= 1e-10


def test_recurrent_follows_the_definition():
    """Two steps by hand: decay along K, delta-rule write, then read with the scaled query."""
    q, k, v, g, beta, h0 = inputs(1, 2, 1, 3, 2)
    S = h0[0, 0].clone()
    outs = []
    for t in range(2):
        S = S * g[0, t, 0].exp()[:, None]
        k_t = k[0, t, 0]
        S = S + beta[0, t, 0] * torch.outer(k_t, v[0, t, 0] - k_t @ S)
        outs.append((3**-0.5 * q[0, t, 0]) @ S)
    o, s = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert rel(o[0, :, 0], torch.stack(outs)) <= 1e-14
    assert rel(s[0, 0], S) <= 1e-14


@pytest.mark.parametrize("C", [64, 24, 5])
@pytest.mark.parametrize("strict", [True, False])
def test_decayed_scores_blocks_match_pairwise(C, strict):
    """The sub-block factorisation equals the direct pairwise sum, and stays finite at strong decay."""
    a, b, _, g, _, _ = inputs(3, C, 1, 16, 1, gate="strong", state=False)
    G = g.cumsum(1)
    keep = torch.ones(C, C, dtype=torch.bool).tril(-1 if strict else 0)
    # Direct form, masked before exp (upper-triangle exponents overflow at these decays).
    diff = (G[:, :, None] - G[:, None, :]).masked_fill(~keep[None, :, :, None, None], -math.inf)
    ref = torch.einsum("bihd,bjhd,bijhd->bhij", a, b, diff.exp())
    M = _decayed_scores(a.movedim(2, 1), b.movedim(2, 1), G.movedim(2, 1), strict=strict)
    assert torch.isfinite(M).all()
    assert rel(M, ref) <= 1e-13


# --- the bounded form: each chunk's scores one matmul through its middle row ----------------------


@pytest.mark.parametrize(
    "chunk,bound,C", [(64, -5.0, 16), (64, -1.0, 64), (64, -20.0, 4), (64, -40.0, 2), (16, -5.0, 16), (64, 0.0, 64)]
)
def test_bounded_chunk_keeps_the_span_within_fp32(chunk, bound, C):
    assert _bounded_chunk(chunk, bound) == C


@pytest.mark.parametrize("bound,g_scale", [(-5.0, 1.0), (-1.0, 0.2), (-20.0, 4.0)])
@pytest.mark.parametrize("state", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("T,chunk", [(1, 64), (37, 16), (130, 64)])
def test_bounded_chunked_matches_recurrent_fp64(T, chunk, state, bound, g_scale):
    q, k, v, g, beta, h0 = inputs(2, T, 2, 16, 8, gate="strong", state=state)
    g = g_scale * g  # strong gates lie in (-5, 0): these in (bound, 0)
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, s = kda_chunked(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=chunk, lower_bound=bound)
    assert rel(o, o_ref) <= 1e-10
    assert rel(s, s_ref) <= 1e-10


@pytest.mark.parametrize("bound,g_scale", [(-5.0, 1.0), (-40.0, 8.0)])
def test_bounded_chunked_fp32_matches_fp64_recurrence(bound, g_scale):
    """Gates at the bound's edge, to -40 a step: every factor through the middle row stays finite."""
    q, k, v, g, beta, h0 = inputs(2, 130, 2, 16, 8, gate="strong")
    g = g_scale * g
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    args = [x.float().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, s = kda_chunked(*args[:5], initial_state=args[5], output_final_state=True, lower_bound=bound)
    assert rel(o.double(), o_ref) <= 1e-4
    assert rel(s.double(), s_ref) <= 1e-4
    grads = torch.autograd.grad(o.sum() + s.sum(), args)
    assert all(torch.isfinite(gr).all() for gr in grads)


def test_bounded_chunked_gradients_match_recurrent():
    args = [x.requires_grad_() for x in inputs(2, 130, 2, 16, 8, gate="strong")]
    gen = rng.generator(1, 0, "test")
    do = torch.randn(2, 130, 2, 8, generator=gen, dtype=torch.float64)
    ds = torch.randn(2, 2, 16, 8, generator=gen, dtype=torch.float64)

    def grads(fn, **kw):
        o, s = fn(*args[:5], initial_state=args[5], output_final_state=True, **kw)
        return torch.autograd.grad((o * do).sum() + (s * ds).sum(), args)

    ref = grads(kda_recurrent)
    got = grads(kda_chunked, chunk_size=64, lower_bound=-5.0)
    for name, x, r in zip(("q", "k", "v", "g", "beta", "initial_state"), got, ref, strict=True):
        assert rel(x, r) <= 1e-8, name


def test_bounded_chunked_refuses_a_gate_below_its_bound():
    q, k, v, g, beta, _ = inputs(1, 20, 1, 8, 4, gate="strong")
    with pytest.raises(ValueError, match="below lower_bound -1.0"):
        kda_chunked(q, k, v, g, beta, lower_bound=-1.0)


@pytest.mark.parametrize("bound", [-5.0, None])
def test_the_layer_hands_its_gate_bound_to_the_chunked_form(monkeypatch, bound):
    seen = []

    def spy(*args, lower_bound=None, **kw):
        seen.append(lower_bound)
        return kda_chunked(*args, lower_bound=lower_bound, **kw)

    monkeypatch.setattr(kda_module.chunked, "kda_chunked", spy)
    make_layer(gate_lower_bound=bound, backend="chunked")(torch.randn(1, 8, 32, generator=rng.generator(0, 0, "test")))
    assert seen == [bound]


# --- gate 2: gradients -----------------------------------------------------------------------------


@pytest.mark.parametrize("T,chunk,gate", [(37, 16, "soft"), (130, 64, "strong")])
def test_chunked_gradients_match_recurrent(T, chunk, gate):
    args = [x.requires_grad_() for x in inputs(2, T, 2, 16, 8, gate=gate)]
    gen = rng.generator(1, 0, "test")
    do = torch.randn(2, T, 2, 8, generator=gen, dtype=torch.float64)
    ds = torch.randn(2, 2, 16, 8, generator=gen, dtype=torch.float64)

    def grads(fn, **kw):
        o, s = fn(*args[:5], initial_state=args[5], output_final_state=True, **kw)
        return torch.autograd.grad((o * do).sum() + (s * ds).sum(), args)

    ref = grads(kda_recurrent)
    got = grads(kda_chunked, chunk_size=chunk)
    for name, x, r in zip(("q", "k", "v", "g", "beta", "initial_state"), got, ref, strict=True):
        assert rel(x, r) <= 1e-8, name


@pytest.mark.parametrize("bound", [None, -5.0])
def test_gradcheck_chunked(bound):
    # chunk 32 = two sub-blocks of 16, so both halves of _decayed_scores are checked; T=20 pads. With the
    # bound, two chunks of 16.
    args = [x.requires_grad_() for x in inputs(1, 20, 1, 3, 2, gate="strong", seed=2)]

    def f(q, k, v, g, beta, h0):
        return kda_chunked(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=32, lower_bound=bound
        )

    # fast mode (random projections of the Jacobian): the full Jacobian is already compared against the
    # recurrence's above, and the full check costs one forward per input element.
    assert torch.autograd.gradcheck(f, args, fast_mode=True)


def test_gradcheck_recurrent():
    args = [x.requires_grad_() for x in inputs(1, 5, 1, 3, 2, seed=3)]

    def f(q, k, v, g, beta, h0):
        return kda_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)

    assert torch.autograd.gradcheck(f, args)


# --- gate 3: every parameter group learns ----------------------------------------------------------


@pytest.fixture(scope="module")
def trainer_like_grads():
    """One backward at a trainer-like shape: B=2, T=100, d=128, H=4, K=32, chunk 64."""
    layer = KDALayer(128, 4, 32, generator=rng.generator(0, 0, "init"), backend="chunked", chunk_size=64)
    x = torch.randn(2, 100, 128, generator=rng.generator(0, 0, "test"))
    layer(x).square().mean().backward()
    return {name: [p.grad for p in params] for name, params in layer.param_groups().items()}


@pytest.mark.parametrize("group", KDA_PARAM_GROUPS)
def test_every_param_group_gets_a_gradient(trainer_like_grads, group):
    grads = trainer_like_grads[group]
    assert grads, f"{group} has no parameters"
    for grad in grads:
        assert grad is not None, f"{group} is detached from the loss"
        assert torch.isfinite(grad).all(), f"{group} has a non-finite gradient"
        assert grad.abs().max() > 0, f"{group} has an all-zero gradient"


@pytest.mark.parametrize("short_conv", [True, False])
def test_param_groups_partition_the_parameters(short_conv):
    layer = make_layer(short_conv=short_conv)
    groups = layer.param_groups()
    expected = [n for n in KDA_PARAM_GROUPS if short_conv or not n.endswith("_conv")]
    assert list(groups) == expected
    listed = [id(p) for params in groups.values() for p in params]
    assert sorted(listed) == sorted(id(p) for p in layer.parameters())


# --- gate 4: decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("short_conv", [True, False])
def test_step_matches_forward(short_conv):
    layer = make_layer(short_conv=short_conv, backend="chunked", chunk_size=16)
    x = torch.randn(2, 21, 32, generator=rng.generator(0, 0, "test"))
    with torch.no_grad():
        full = layer(x)
        cache, ys = None, []
        for t in range(x.shape[1]):
            y, cache = layer.step(x[:, t], cache)
            ys.append(y)
    assert rel(torch.stack(ys, 1), full) <= 1e-5
    assert cache.state.shape == (2, 2, 8, 8) and cache.state.dtype == torch.float32


@pytest.mark.parametrize("short_conv", [True, False])
def test_prefill_then_step_matches_forward(short_conv):
    layer = make_layer(short_conv=short_conv, backend="chunked", chunk_size=16)
    x = torch.randn(2, 25, 32, generator=rng.generator(0, 0, "test"))
    with torch.no_grad():
        full = layer(x)
        y0, prefilled = layer(x[:, :19], return_cache=True)
        ys, cache = [y0], prefilled
        for t in range(19, 25):
            y, cache = layer.step(x[:, t], cache)
            ys.append(y[:, None])
        y1 = layer(x[:, 19:], cache=prefilled)  # or continue with a second chunked call
    assert rel(torch.cat(ys, 1), full) <= 1e-5
    assert rel(torch.cat([y0, y1], 1), full) <= 1e-5


def test_a_cache_under_autograd_equals_the_one_without():
    # Under autograd q, k, v are convolved as slices of one projection (ops/short_conv/ `convolve_packed`) and the
    # conv tails cut from it; without, each conv runs on its own projection: the same output and cache, to
    # the rounding of one matmul against six.
    layer = make_layer(backend="chunked", chunk_size=16)
    for T in (19, 2):  # 2: shorter than the conv, its tail padded with zeros in front
        x = torch.randn(2, T, 32, generator=rng.generator(0, T, "test"))
        y, cache = layer(x, return_cache=True)
        with torch.no_grad():
            y_ref, cache_ref = layer(x, return_cache=True)
        assert rel(y.detach(), y_ref) <= 1e-5 and rel(cache.state.detach(), cache_ref.state) <= 1e-5
        assert all(rel(a.detach(), b) <= 1e-5 for a, b in zip(cache.conv, cache_ref.conv, strict=True))
        assert [tuple(t.shape) for t in cache.conv] == [(2, 3, 16)] * 3


# --- the layer's pieces ----------------------------------------------------------------------------


def test_construction_leaves_the_global_rng_alone_and_is_reproducible():
    before = torch.random.get_rng_state()
    a, b = make_layer(seed=5), make_layer(seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    c = make_layer(seed=6)
    assert not torch.equal(a.q_proj.weight, c.q_proj.weight)
    b.reset_parameters(rng.generator(5, 0, "init"))  # reset from a fresh stream reproduces the init
    assert torch.equal(a.A_log, b.A_log) and torch.equal(a.o_proj.weight, b.o_proj.weight)


def test_init_follows_fla():
    layer = make_layer(d=64, H=8, K=16)
    assert 0.015 < layer.q_proj.weight.std().item() < 0.025
    assert (layer.A_log >= 0).all() and (layer.A_log <= math.log(16)).all()
    dt = F.softplus(layer.dt_bias)
    assert (dt >= 1e-4 * (1 - 1e-5)).all() and (dt <= 0.1 * (1 + 1e-5)).all()
    assert torch.equal(layer.g_b.bias, torch.zeros_like(layer.g_b.bias))
    assert torch.equal(layer.o_norm.norm.weight, torch.ones(16))


@pytest.mark.parametrize("lower_bound", [-5.0, None])
def test_decay_gate_range(lower_bound):
    layer = make_layer(gate_lower_bound=lower_bound)
    with torch.no_grad():
        layer.f_b.weight.mul_(500)  # push the gate pre-activations far out on both sides
        f = layer._gate_input(layer.f_a(torch.randn(2, 50, 32, generator=rng.generator(0, 0, "test"))))
        g = decay(f, layer.A_log, layer.dt_bias, lower_bound)
    assert g.dtype == torch.float32 and (g <= 0).all()
    if lower_bound is not None:
        assert (g >= lower_bound).all() and g.min() < 0.9 * lower_bound


def test_gated_rms_norm():
    norm = GatedRMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.norm.weight.copy_(torch.arange(1.0, 9.0))
    x, gate = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    ref = x / (x.square().mean(-1, keepdim=True) + 1e-6).sqrt() * torch.arange(1.0, 9.0) * gate.sigmoid()
    counters.NORM.reset()
    assert rel(norm(x, gate), ref) <= 1e-12
    assert (counters.NORM.fused, counters.NORM.calls) == (0, 1)


# --- dispatch, counters, determinism ---------------------------------------------------------------


def test_fla_on_cpu_is_refused_through_the_ledger():
    assert ledger.SITES["kda.fla_unavailable"].kind is ledger.Kind.LOUD
    q, k, v, g, beta, _ = inputs(1, 4, 1, 4, 4, dtype=torch.float32)
    with pytest.raises(ledger.FallbackRefused, match="--kda-backend chunked") as err:
        kda(q, k, v, g, beta, backend="fla")
    assert err.value.site == "kda.fla_unavailable"


def test_auto_on_cuda_without_fla_is_refused(monkeypatch):
    # Only the device type and the import are consulted, so this runs without a GPU.
    monkeypatch.setattr(fla_kernels, "chunk_kda", lambda: (None, "ModuleNotFoundError: No module named 'fla'"))
    for requested in ("auto", "fla"):
        with pytest.raises(ledger.FallbackRefused, match="install the extra `gpu`") as err:
            registry.resolve("kda", requested, torch.device("cuda"))
        assert err.value.site == "kda.fla_unavailable"


def test_resolve_backend_names():
    cpu = torch.device("cpu")
    assert registry.resolve("kda", "auto", cpu) == "chunked"
    assert registry.resolve("kda", "chunked", cpu) == "chunked"
    assert registry.resolve("kda", "recurrent", cpu) == "recurrent"
    with pytest.raises(ValueError, match="unknown kda backend"):
        registry.resolve("kda", "triton", cpu)
    with pytest.raises(ValueError, match="unknown kda backend"):
        make_layer(backend="triton")


def test_counters_record_every_call_as_unfused_on_cpu():
    q, k, v, g, beta, _ = inputs(1, 8, 1, 4, 4, dtype=torch.float32)
    counters.KDA.reset()
    o_auto, _ = kda(q, k, v, g, beta)
    o_rec, _ = kda(q, k, v, g, beta, backend="recurrent")
    make_layer()(torch.randn(1, 8, 32, generator=rng.generator(0, 0, "test")))
    assert (counters.KDA.fused, counters.KDA.calls) == (0, 3)
    assert rel(o_auto, o_rec) <= 1e-5


def test_bitwise_deterministic():
    q, k, v, g, beta, h0 = inputs(2, 70, 2, 16, 8, dtype=torch.float32)
    a = kda_chunked(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    b = kda_chunked(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    layer = make_layer(backend="chunked", chunk_size=16)
    x = torch.randn(2, 40, 32, generator=rng.generator(0, 0, "test"))
    assert torch.equal(layer(x), layer(x))


def test_under_bf16_autocast_the_op_gets_bf16_q_k_v(monkeypatch):
    # CUDA's autocast runs l2norm's sum and rsqrt in fp32 (the CPU's does not: imitated below); q, k
    # would then reach fla in fp32 and it would run its fp32 kernels in a bf16 run.
    seen = {}
    monkeypatch.setattr(kda_module, "l2norm", lambda x: l2norm(x.float()))

    def spy(q, k, v, g, beta, **kw):
        seen.update(q=q.dtype, k=k.dtype, v=v.dtype, g=g.dtype)
        return kda_chunked(q.float(), k.float(), v.float(), g, beta.float(), **{"initial_state": None})

    monkeypatch.setattr(kda_module, "kda", spy)
    layer = KDALayer(32, 2, 16, generator=rng.generator(0, 0, "init"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.randn(1, 8, 32, generator=rng.generator(0, 0, "test")))
    assert seen == {"q": torch.bfloat16, "k": torch.bfloat16, "v": torch.bfloat16, "g": torch.float32}


@pytest.mark.parametrize("prep_in_kernel", [True, False])
def test_fla_gets_the_gate_input_uncast_when_it_computes_the_gate(monkeypatch, prep_in_kernel):
    # fla's in-kernel gate reads the gate projection's bf16 output as it is (a cast to fp32 would copy
    # [B, T, H, K] each way for the same bits: tests/gpu/test_kda_fla.py); the log-decay it is handed
    # otherwise goes in fp32, which fla accumulates.
    seen = {}

    def stand_in(q, k, v, g, beta, **kw):
        seen.update(q=q.dtype, g=g.dtype, beta=beta.dtype)
        return torch.zeros_like(v), None

    monkeypatch.setattr(fla_kernels, "chunk_kda", lambda: (stand_in, ""))
    force(monkeypatch, {"kda": "fla"})
    layer = make_layer(backend="fla", fla_prep_in_kernel=prep_in_kernel)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.randn(1, 8, 32, generator=rng.generator(0, 0, "test")))
    gate_dtype = torch.bfloat16 if prep_in_kernel else torch.float32
    assert seen == {"q": torch.bfloat16, "g": gate_dtype, "beta": torch.bfloat16}


# --- fla's kernel options (kda_safe_gate, kda_recompute) ---------------------------------------------


def test_fla_options_reach_fla_and_default_to_none(monkeypatch):
    # A stand-in for fla's chunk_kda records the keywords the layer hands it.
    seen = []

    def stand_in(q, k, v, g, beta, **kw):
        seen.append({name: kw[name] for name in ("safe_gate", "lower_bound", "disable_recompute") if name in kw})
        return torch.zeros_like(v), None

    monkeypatch.setattr(fla_kernels, "chunk_kda", lambda: (stand_in, ""))
    force(monkeypatch, {"kda": "fla"})
    x = torch.randn(1, 8, 32, generator=rng.generator(0, 0, "test"))
    make_layer()(x)
    make_layer(fla_safe_gate=True, fla_recompute=False)(x)
    make_layer(gate_lower_bound=-3.0, fla_safe_gate=True)(x)
    assert seen == [
        {},
        {"safe_gate": True, "lower_bound": -5.0, "disable_recompute": True},
        {"safe_gate": True, "lower_bound": -3.0},
    ]


def fla_as_documented(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64, **kw):
    """A stand-in for fla's chunk_kda that applies its in-kernel extras as fla 0.6.0 documents them
    (fla/ops/kda/chunk.py, gate.py), then runs the chunked form."""
    H, K = g.shape[-2:]
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    if kw.get("use_gate_in_kernel"):
        g = g + kw["dt_bias"].view(H, K)
        A = kw["A_log"].exp()[:, None]
        g = -A * F.softplus(g) if kw["lower_bound"] is None else kw["lower_bound"] * torch.sigmoid(A * g)
    if kw.get("use_beta_sigmoid_in_kernel"):
        beta = torch.sigmoid(beta)
    return kda_chunked(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)


@pytest.mark.parametrize("lower_bound", [-5.0, None])
def test_prep_in_kernel_hands_fla_the_raw_inputs_it_documents(monkeypatch, lower_bound):
    # fla applying the L2 norms, the gate and beta's sigmoid itself must compute the layer's function:
    # with a stand-in that applies them as fla documents, the layer's output and every parameter's
    # gradient equal the chunked form's in float64, but for the gate's input rounded to fp32 (as fla
    # takes it: a wrong wiring is off by 1e-1, not 1e-7).
    assert_fla_layer_equals_chunked(monkeypatch, fla_as_documented, gate_lower_bound=lower_bound)


def assert_fla_layer_equals_chunked(monkeypatch, chunk_kda, fused_convs=False, **layer_kw):
    """The layer on the fla backend with prep in kernel, fla's chunk_kda the stand-in `chunk_kda` (and
    with `fused_convs` its convs on the fused path, their kernels tests/conv_stand_in.py's): its output
    and every parameter's gradient equal the chunked form's, plain convs, in float64 (1e-8, 1e-6)."""
    x = torch.randn(2, 70, 32, dtype=torch.float64, generator=rng.generator(0, 0, "test"))
    ref_layer = make_layer(backend="chunked", **layer_kw).double()
    ref = ref_layer(x)
    ref.square().sum().backward()
    monkeypatch.setattr(fla_kernels, "chunk_kda", lambda: (chunk_kda, ""))
    force(monkeypatch, {"kda": "fla"})
    if fused_convs:
        monkeypatch.setattr(conv_fused, "fused_kernels", lambda: (StandInKernels, ""))
        force(monkeypatch, {"kda": "fla", "conv": "fused"})
    layer = make_layer(backend="fla", fla_prep_in_kernel=True, **layer_kw).double()
    out = layer(x)
    out.square().sum().backward()
    assert rel(out, ref) <= 1e-8
    for (name, p), p_ref in zip(layer.named_parameters(), ref_layer.parameters(), strict=True):
        assert rel(p.grad, p_ref.grad) <= 1e-6, name


class FlaPartsAsDocumented:
    """A stand-in for fla's parts under chunk_kda (fla_kernels.ChunkKDAParts, ops/kda/fla.py's Function):
    `fwd` computes `fla_as_documented`'s function of the raw gate, `bwd` differentiates it by autograd,
    the beta sigmoid is torch's; each call recorded."""

    calls = []

    @staticmethod
    def beta_sigmoid_fwd(x):
        return torch.sigmoid(x.to(torch.promote_types(x.dtype, torch.float32)))

    @staticmethod
    def beta_sigmoid_bwd(x, dy):
        s = torch.sigmoid(x.to(dy.dtype))
        return (dy * s * (1 - s)).to(x.dtype)

    @staticmethod
    def _o(q, k, v, g, beta, scale, chunk_size, A_log, dt_bias, lower_bound):
        gate = {"use_gate_in_kernel": True, "A_log": A_log, "dt_bias": dt_bias, "lower_bound": lower_bound}
        return fla_as_documented(q, k, v, g, beta, scale, chunk_size=chunk_size, **gate)[0]

    @classmethod
    def fwd(cls, q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, **kw):
        cls.calls.append(("fwd", initial_state, output_final_state, kw["use_gate_in_kernel"]))
        o = cls._o(q, k, v, g, beta, scale, chunk_size, kw["A_log"], kw["dt_bias"], kw["lower_bound"])
        return (o, *(None,) * 11)

    @classmethod
    def bwd(cls, q, k, v, beta, Aqk, Akk, scale, initial_state, do, dht, g, g_org, chunk_size, **kw):
        cls.calls.append(("bwd", initial_state, dht, kw["use_gate_in_kernel"]))
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v, beta, g_org, kw["A_log"], kw["dt_bias"])]
            q, k, v, beta, g_org, A_log, dt_bias = leaves
            o = cls._o(q, k, v, g_org, beta, scale, chunk_size, A_log, dt_bias, kw["lower_bound"])
            dq, dk, dv, db, dg, dA, dbias = torch.autograd.grad(o, leaves, do)
        return dq, dk, dv, db, dg, None, dA, dbias


@pytest.mark.parametrize("K", [8, 6], ids=["head8", "head6"])
def test_the_fused_convs_normalise_q_and_k_and_fla_is_not_asked_to_again(monkeypatch, K):
    # With the conv kernels fused (their float64 stand-in), the packed convs L2-normalise q and k inside
    # the conv launch and hand out fp32 gradient sinks: fla's forward and backward run under ops/kda/fla.py's
    # Function (fla's chunk_kda not at all), q's and k's gradients reach the convs through the sinks, and
    # the layer's output and every parameter's gradient still equal the chunked form's (a second norm or
    # none would not, nor a gradient lost on the way). A head that is not a power of two (the kernels'
    # channel blocks are whole heads) leaves the norm to fla's chunk_kda, told to apply it.
    flags = []

    def fla_recording(*args, **kw):
        flags.append(kw["use_qk_l2norm_in_kernel"])
        return fla_as_documented(*args, **kw)

    StandInKernels.calls, FlaPartsAsDocumented.calls = [], []
    monkeypatch.setattr(fla_kernels, "chunk_kda_parts", lambda: (FlaPartsAsDocumented, ""))
    assert_fla_layer_equals_chunked(monkeypatch, fla_recording, fused_convs=True, K=K)
    normed_in_conv = K == 8
    assert [c[0] for c in StandInKernels.calls] == ["forward", "backward"]
    if normed_in_conv:
        assert flags == [] and FlaPartsAsDocumented.calls == [("fwd", None, False, True), ("bwd", None, None, True)]
    else:
        assert flags == [True] and FlaPartsAsDocumented.calls == []
    # q and k normalised over each head in the conv's launch, or neither
    assert StandInKernels.calls[0][-2:] == ((2, K) if normed_in_conv else (0, K))


def test_fla_options_leave_the_exact_forms_unchanged_and_need_a_bounded_gate():
    x = torch.randn(2, 70, 32, generator=rng.generator(0, 0, "test"))
    plain = make_layer(backend="chunked")(x)
    exact = make_layer(backend="chunked", fla_safe_gate=True, fla_recompute=False, fla_prep_in_kernel=True)
    assert torch.equal(exact(x), plain)
    with pytest.raises(ValueError, match="safe_gate needs the gate's lower bound"):
        make_layer(gate_lower_bound=None, fla_safe_gate=True)
    for out_of_range in (-5.5, 0.0):
        with pytest.raises(ValueError, match=r"safe_gate needs gate_lower_bound in \[-5, 0\)"):
            make_layer(gate_lower_bound=out_of_range, fla_safe_gate=True)
    make_layer(gate_lower_bound=-20.0)  # without safe_gate any bound in the config's range builds
