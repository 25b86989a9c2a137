"""KDA's bounded chunked form as one Function (ops/kda/bounded.py): its hand-written backward against
gradcheck, against autograd through the plain bounded form (chunked.py's `_bounded_chunks`) and against
the fp64 recurrence; gates at the bound; determinism, dtypes, the dispatch.

Errors are relative to the reference's scale, as in tests/test_kda.py: max|x - ref| <= tol · max|ref|
(`close`, which takes an all-zero reference, such as g's gradient at T = 1 from a zero state).
"""

import pytest
import torch
from test_kda import inputs, make_layer

from dormouse import rng
from dormouse.ops.kda import chunked
from dormouse.ops.kda.bounded import bounded_chunks
from dormouse.ops.kda.chunked import _bounded_chunks, kda_chunked
from dormouse.ops.kda.reference import kda_recurrent

# tiny ops, hundreds of them per gradcheck: one thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def close(x: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    return bool((x - ref).abs().max() <= tol * ref.abs().max())


def chunk_inputs(N, B, H, C, K, V, *, dtype=torch.float64, g_min=-5.0, seed=0):
    """The Function's own inputs, in chunks [N,B,H,C,*]: G each chunk's cumulative log-decay of gates in
    (g_min, 0), the state carried in [B,H,K,V]."""
    q, k, v, g, beta, h0 = inputs(N * B, C, H, K, V, gate="strong", seed=seed)
    g = g * (g_min / -5.0)

    def chunked_(x):  # [N·B, C, H, ...] -> [N, B, H, C, ...]
        return x.unflatten(0, (N, B)).transpose(2, 3).contiguous().to(dtype)

    return chunked_(q), chunked_(k), chunked_(v), chunked_(g.cumsum(1)), chunked_(beta), h0[:B].to(dtype)


def output_grads(o, s, seed=1):
    """Random cotangents for o and the final state (fixed by `seed`)."""
    gen = rng.generator(seed, 0, "test")
    return tuple(torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.dtype) for x in (o, s))


# --- the hand-written backward -------------------------------------------------------------------------


@pytest.mark.parametrize("T,h0", [(20, True), (16, False), (5, True)])
def test_gradcheck_through_kda_chunked(T, h0):
    # Chunks of 16 under the bound -5: T=20 pads the second chunk, T=5 is one padded chunk. The full
    # Jacobian (not fast mode): every input element, o and the final state.
    args = [x.requires_grad_() for x in inputs(1, T, 2, 3, 2, gate="strong", seed=2, state=h0) if x is not None]

    def f(q, k, v, g, beta, *state):
        init = state[0] if state else None
        return kda_chunked(q, k, v, g, beta, initial_state=init, output_final_state=True, lower_bound=-5.0)

    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("C", [16, 5, 1])
def test_gradcheck_of_the_function(C):
    # the Function on its own chunks, scale not 1; C=5: an odd chunk (the middle row off-centre), C=1: no scores
    args = [x.requires_grad_() for x in chunk_inputs(3, 1, 2, C, 3, 2, seed=3)]
    assert torch.autograd.gradcheck(lambda *a: bounded_chunks(*a, scale=0.7), args)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("C,g_min", [(16, -5.0), (64, -1.0), (4, -20.0)])
def test_matches_autograd_through_the_plain_form(C, g_min, dtype, tol):
    args = [x.requires_grad_() for x in chunk_inputs(5, 2, 2, C, 16, 8, dtype=dtype, g_min=g_min)]
    o_ref, s_ref = _bounded_chunks(args[0] * 0.25, *args[1:])
    o, s = bounded_chunks(*args, scale=0.25)
    assert close(o, o_ref, tol) and close(s, s_ref, tol)
    d_o, d_s = output_grads(o, s)
    ref = torch.autograd.grad((o_ref * d_o).sum() + (s_ref * d_s).sum(), args)
    got = torch.autograd.grad((o * d_o).sum() + (s * d_s).sum(), args)
    for name, x, r in zip(("q", "k", "v", "G", "beta", "S"), got, ref, strict=True):
        assert close(x, r, tol), name


@pytest.mark.parametrize("state", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("T,chunk", [(1, 64), (37, 16), (130, 64)])
def test_forward_and_backward_match_the_recurrence(T, chunk, state):
    args = [x.requires_grad_() if x is not None else None for x in inputs(2, T, 2, 16, 8, gate="strong", state=state)]
    d_o, d_s = output_grads(torch.empty(2, T, 2, 8), torch.empty(2, 2, 16, 8))

    def run(fn, **kw):
        o, s = fn(*args[:5], initial_state=args[5], output_final_state=True, **kw)
        grads = torch.autograd.grad((o * d_o).sum() + (s * d_s).sum(), [x for x in args if x is not None])
        return o, s, grads

    o_ref, s_ref, ref = run(kda_recurrent)
    o, s, got = run(kda_chunked, chunk_size=chunk, lower_bound=-5.0)
    assert close(o, o_ref, 1e-10) and close(s, s_ref, 1e-10)
    for name, x, r in zip(NAMES, got, ref, strict=False):
        assert close(x, r, 1e-9), name


@pytest.mark.parametrize("at", ["all", "alternate"])
def test_gates_exactly_at_the_bound(at):
    # Every gate at -5 (a chunk's full budget, e^±40 through the middle row) or alternating -5 and 0: fp32
    # stays finite and matches the fp64 recurrence, values and gradients.
    q, k, v, g, beta, h0 = inputs(2, 70, 2, 16, 8, gate="strong")
    g = torch.full_like(g, -5.0)
    if at == "alternate":
        g[:, 1::2] = 0.0
    args64 = [x.requires_grad_() for x in (q, k, v, g, beta, h0)]
    args32 = [x.detach().float().requires_grad_() for x in args64]
    d_o, d_s = output_grads(torch.empty(2, 70, 2, 8), torch.empty(2, 2, 16, 8))

    def run(fn, args, **kw):
        o, s = fn(*args[:5], initial_state=args[5], output_final_state=True, **kw)
        return o, s, torch.autograd.grad((o * d_o.to(o.dtype)).sum() + (s * d_s.to(s.dtype)).sum(), args)

    o_ref, s_ref, ref = run(kda_recurrent, args64)
    o, s, got = run(kda_chunked, args32, lower_bound=-5.0)
    assert close(o.double(), o_ref, 1e-4) and close(s.double(), s_ref, 1e-4)
    for name, x, r in zip(NAMES, got, ref, strict=True):
        assert torch.isfinite(x).all() and close(x.double(), r, 1e-3), name


def test_a_second_derivative_is_refused_not_wrong():
    args = [x.float().requires_grad_() for x in inputs(1, 20, 1, 8, 4, gate="strong")]
    o, _ = kda_chunked(*args[:5], initial_state=args[5], lower_bound=-5.0)
    (d_q,) = torch.autograd.grad(o.square().sum(), args[0], create_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        d_q.sum().backward()


# --- dtypes, determinism, dispatch ---------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
def test_bitwise_deterministic_values_and_gradients(threads):
    # two threads too, as the trainer runs on two cores: the batched matmuls then split their batch
    def run():
        args = [x.float().requires_grad_() for x in inputs(2, 70, 2, 16, 8, gate="strong")]
        o, s = kda_chunked(*args[:5], initial_state=args[5], output_final_state=True, lower_bound=-5.0)
        return (o, s, *torch.autograd.grad(o.square().sum() + s.sum(), args))

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        first, second = run(), run()
    finally:
        torch.set_num_threads(before)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_bf16_inputs_run_in_fp32_and_get_bf16_gradients():
    args32 = [x.float() for x in inputs(1, 40, 2, 16, 8, gate="strong")]
    args16 = [x.bfloat16().requires_grad_() for x in args32]
    o, s = kda_chunked(*args16[:5], initial_state=args16[5], output_final_state=True, lower_bound=-5.0)
    o_ref, _ = kda_chunked(*(x.float() for x in args16[:5]), initial_state=args16[5].float(), lower_bound=-5.0)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert torch.equal(o, o_ref.bfloat16())
    grads = torch.autograd.grad(o.float().square().sum() + s.sum(), args16)
    assert all(gr.dtype == torch.bfloat16 and torch.isfinite(gr).all() for gr in grads)


def test_autocast_leaves_the_arithmetic_in_the_inputs_dtype():
    args = [x.float().requires_grad_() for x in inputs(1, 40, 2, 16, 8, gate="strong")]

    def run():
        o, s = kda_chunked(*args[:5], initial_state=args[5], output_final_state=True, lower_bound=-5.0)
        return (o, s, *torch.autograd.grad(o.square().sum() + s.sum(), args))

    plain = run()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = run()
    for a, b in zip(plain, cast, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bound", [-5.0, None])
def test_the_bound_selects_the_function(monkeypatch, bound):
    calls = []

    def spy(*args, **kw):
        calls.append(args[-1])
        return bounded_chunks(*args, **kw)

    monkeypatch.setattr(chunked, "bounded_chunks", spy)
    layer = make_layer(gate_lower_bound=bound, backend="chunked")
    layer(torch.randn(1, 40, 32, generator=rng.generator(0, 0, "test"))).sum().backward()
    assert calls == ([8**-0.5] if bound is not None else [])
