"""The engram gate (ops/engram_gate/) on the CPU: the fused path's wiring and its kernels' documented
backward formulas, with a stand-in for ops/engram_gate/triton.py that computes those formulas in torch,
against autograd of the float64 gate; the policy (fused with the norms, counted, refused without kernels).

The kernels' own numbers on CUDA are tests/gpu/test_engram_gate_fused.py; the plain path against the
float64 loop is tests/test_engram.py::test_output_equals_the_float64_formula.
"""

import math

import pytest
import torch
from backend_stand_in import force

from dormouse import counters, ledger, rng
from dormouse.model.engram import Engram
from dormouse.model.init import linear, normal_init_
from dormouse.model.norm import RMSNorm
from dormouse.ops import engram_gate
from dormouse.ops.engram_gate import fused as gate_fused

F64 = torch.float64
D, ARMS_DIM = 8, 12


class StandInKernels:
    """ops/engram_gate/triton.py's contract in torch, float64 inside, its backward by the module
    docstring's formulas (not autograd): rows [N, D] with unit column stride, one rounding at each output.
    rstd and α stay float64 here (the kernels keep them in fp32), so the comparisons can be exact."""

    calls = []

    @classmethod
    def forward(cls, h, v, k, w_h, w_k, eps_h, eps_k, scale):
        cls.calls.append(("forward", tuple(h.shape), h.stride(), v.stride(), k.stride(), eps_h, eps_k, scale))
        h, v, k = h.double(), v.double(), k.double()
        rstd_h, rstd_k = (torch.rsqrt((x * x).mean(-1) + eps) for x, eps in ((h, eps_h), (k, eps_k)))
        alpha = torch.sigmoid(((h * rstd_h[:, None] * w_h) * (k * rstd_k[:, None] * w_k)).sum(-1) * scale)
        return (alpha[:, None] * v).to(v.dtype), rstd_h, rstd_k, alpha

    @classmethod
    def backward(cls, h, v, k, w_h, w_k, rstd_h, rstd_k, alpha, g, dv, dk, scale):
        cls.calls.append(("backward", tuple(h.shape), g.stride(), dv.stride(), dk.stride()))
        h_dtype = h.dtype
        h, v, k, g = h.double(), v.double(), k.double(), g.double()
        dv.copy_(alpha[:, None] * g)
        ds = (g * v).sum(-1) * alpha * (1 - alpha) * scale
        h_hat, k_hat = h * rstd_h[:, None], k * rstd_k[:, None]
        dy_h, dy_k = ds[:, None] * k_hat * w_k, ds[:, None] * h_hat * w_h

        def input_grad(x_hat, w, dy, rstd):
            return (w * dy - x_hat * (x_hat * w * dy).mean(-1, keepdim=True)) * rstd[:, None]

        dk.copy_(input_grad(k_hat, w_k, dy_k, rstd_k))
        dh = input_grad(h_hat, w_h, dy_h, rstd_h)
        return dh.to(h_dtype), (dy_h * h_hat).sum(0).to(w_h.dtype), (dy_k * k_hat).sum(0).to(w_k.dtype)


@pytest.fixture
def stand_in(monkeypatch):
    StandInKernels.calls = []
    monkeypatch.setattr(gate_fused, "fused_kernels", lambda: (StandInKernels, ""))
    force(monkeypatch, {"engram_gate": "fused"})
    return StandInKernels.calls


def parts(seed=0):
    """(w_v, w_k, hidden_norm, key_norm) in float64, the gains near 1.5 (and uneven) so that the gate is
    tested away from 1/2."""
    gen = rng.generator(seed, 0, "init")
    w_v, w_k = linear(ARMS_DIM, D).double(), linear(ARMS_DIM, D).double()
    hidden_norm, key_norm = RMSNorm(D, 1e-6).double(), RMSNorm(D, 1e-5).double()
    with torch.no_grad():
        for lin in (w_v, w_k):
            normal_init_(lin.weight, gen)
        for i, norm in enumerate((hidden_norm, key_norm)):
            norm.weight.copy_(1.5 + 0.3 * torch.randn(D, generator=rng.generator(seed, i, "test"), dtype=F64))
    return w_v, w_k, hidden_norm, key_norm


def reference(h, e, w_v, w_k, hidden_norm, key_norm):
    """The module docstring's gate in float64, by hand."""

    def rms(x, norm):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + norm.eps) * norm.weight

    v, k = e @ w_v.weight.T, e @ w_k.weight.T
    s = (rms(k, key_norm) * rms(h, hidden_norm)).sum(-1, keepdim=True) / math.sqrt(h.shape[-1])
    return torch.sigmoid(s) * v


def inputs(seed=1):
    gen = rng.generator(seed, 0, "test")
    h = (3 * torch.randn(2, 5, D, generator=gen, dtype=F64)).requires_grad_()
    e = torch.randn(2, 5, ARMS_DIM, generator=gen, dtype=F64).requires_grad_()
    return h, e, torch.randn(2, 5, D, generator=gen, dtype=F64)


def grads(out, g, h, e, modules):
    params = [p for m in modules for p in m.parameters()]
    return torch.autograd.grad(out, [h, e, *params], g)


def test_fused_gate_and_its_formulas_equal_autograd_of_the_float64_gate(stand_in):
    h, e, g = inputs()
    modules = parts()
    out = engram_gate.gate(h, e, *modules)
    ref = reference(h, e, *modules)
    alpha = (ref / (e @ modules[0].weight.T)).detach()
    assert alpha.min() < 0.3 and alpha.max() > 0.7  # the gate is tested away from 1/2
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads(out, g, h, e, modules), grads(ref, g, h, e, modules), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_fused_reads_v_and_k_from_one_matmul_and_writes_their_gradient_into_one_tensor(stand_in):
    h, e, g = inputs()
    out = engram_gate.gate(h, e, *parts())
    torch.autograd.grad(out, h, g)
    (fwd, shape, h_stride, v_stride, k_stride, eps_h, eps_k, scale), bwd = stand_in
    assert fwd == "forward" and shape == (10, D) and h_stride == (D, 1)
    assert v_stride == k_stride == (2 * D, 1)  # the halves of [v | k], rows of the packed output
    assert (eps_h, eps_k, scale) == (1e-6, 1e-5, D**-0.5)
    assert bwd[0] == "backward" and bwd[3] == bwd[4] == (2 * D, 1)  # dv, dk: the halves of one gradient


def test_without_autograd_the_forward_kernel_runs_on_the_two_linears(stand_in):
    h, e, _ = inputs()
    modules = parts()
    with torch.no_grad():
        out = engram_gate.gate(h, e, *modules)
    torch.testing.assert_close(out, reference(h, e, *modules), rtol=1e-12, atol=1e-12)
    assert [c[0] for c in stand_in] == ["forward"] and stand_in[0][3] == stand_in[0][4] == (D, 1)


def test_fused_counts_as_the_two_norms_calls(stand_in):
    h, e, _ = inputs()
    counters.NORM.reset()
    engram_gate.gate(h, e, *parts())
    assert (counters.NORM.fused, counters.NORM.calls) == (2, 2)


def test_the_module_fused_equals_plain(stand_in, monkeypatch):
    def memory():
        m = Engram(orders=(1, 2), heads=2, rows=11, dim=3, d_model=D, seed=0, generator=rng.generator(0, 0, "init"))
        return m.double()

    fused, plain = memory(), memory()
    x = torch.randint(0, 256, (2, 6), generator=rng.generator(0, 1, "test"))
    h = torch.randn(2, 6, D, generator=rng.generator(0, 2, "test"), dtype=F64)
    out_fused, _, _ = fused(h, fused.keys(x))
    out_fused.sum().backward()
    force(monkeypatch, {"engram_gate": "plain"})
    out_plain, _, _ = plain(h, plain.keys(x))
    out_plain.sum().backward()
    assert [c[0] for c in stand_in] == ["forward", "backward"]
    torch.testing.assert_close(out_fused, out_plain, rtol=1e-12, atol=1e-12)
    for (name, a), b in zip(fused.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a.grad.to_dense(), b.grad.to_dense(), rtol=1e-10, atol=1e-12, msg=name)


def test_fused_without_kernels_is_refused_through_the_ledger(monkeypatch):
    monkeypatch.setattr(gate_fused, "fused_kernels", lambda: (None, "ImportError: no triton"))
    force(monkeypatch, {"engram_gate": "fused"})
    h, e, _ = inputs()
    with pytest.raises(ledger.FallbackRefused, match="--norm-backend plain") as err:
        engram_gate.gate(h, e, *parts())
    assert err.value.site == "norm.fused_unavailable"


def test_fused_on_cpu_is_refused_through_the_ledger():
    modules = parts()
    for norm in modules[2:]:
        norm.backend = "fused"
    h, e, _ = inputs()
    with pytest.raises(ledger.FallbackRefused, match="--norm-backend plain") as err:
        engram_gate.gate(h, e, *modules)
    assert err.value.site == "norm.fused_unavailable"
