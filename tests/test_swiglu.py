"""The FFN's SwiGLU activation on the CPU: the plain path against float64 by hand, the fused path's wiring
(which halves of the packed projection it reads, where it writes their gradients) with a stand-in for the
kernels (ops/swiglu/triton.py) that follows their contract, and the backend policy.

The fused kernels' own numbers on CUDA are tests/gpu/test_swiglu_fused.py.
"""

import pytest
import torch
from backend_stand_in import force

from dormouse import config, counters, ledger
from dormouse.model.ffn import SwiGLU, set_swiglu_backend
from dormouse.model.model import DormouseLM
from dormouse.ops.swiglu import fused as swiglu_fused
from dormouse.ops.swiglu import reference as swiglu_reference
from dormouse.resolve import resolve


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g, u = gate.double(), up.double()
    return g / (1 + torch.exp(-g)) * u


class StandInKernels:
    """ops/swiglu/triton.py's contract in torch: [N, H] operands with unit column stride (row strides
    as given), the maths in fp32, one rounding to the output's dtype; `backward` writes into d_gate, d_up."""

    calls = []

    @classmethod
    def forward(cls, gate, up):
        cls.calls.append(("forward", tuple(gate.shape), gate.stride(), up.stride()))
        x, y = gate.float(), up.float()
        return (x * torch.sigmoid(x) * y).to(gate.dtype)

    @classmethod
    def backward(cls, gate, up, g, d_gate, d_up):
        cls.calls.append(("backward", tuple(gate.shape), d_gate.stride(), d_up.stride()))
        x, y, g = gate.float(), up.float(), g.float()
        s = torch.sigmoid(x)
        d_gate.copy_(g * s * (1 + x * (1 - s)) * y)
        d_up.copy_(g * x * s)


@pytest.fixture
def stand_in(monkeypatch):
    StandInKernels.calls = []
    monkeypatch.setattr(swiglu_fused, "fused_kernels", lambda: (StandInKernels, ""))
    force(monkeypatch, {"swiglu": "fused"})
    return StandInKernels.calls


def make_ffn(seed=0, d=6, hidden=5) -> SwiGLU:
    return SwiGLU(d, hidden, generator=torch.Generator().manual_seed(seed)).double()


def test_plain_is_silu_gate_times_up():
    gen = torch.Generator().manual_seed(1)
    gate, up = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)
    assert torch.allclose(swiglu_reference.swiglu(gate, up).double(), reference(gate, up), rtol=1e-6, atol=1e-7)


def test_fused_packed_reads_the_halves_and_writes_one_gradient(stand_in):
    # h [..., 2H]: gate is the first half, up the second; the gradient comes back as one [..., 2H] tensor
    # equal (float64) to autograd's of the formula.
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(2, 3, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64)
    out = swiglu_fused.fused_packed(h)
    (dh,) = torch.autograd.grad(out, h, g)
    h_ref = h.detach().clone().requires_grad_()
    ref = reference(h_ref[..., :5], h_ref[..., 5:])
    (dh_ref,) = torch.autograd.grad(ref, h_ref, g)
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-7)  # the stand-in computes in fp32, as the kernels
    assert torch.allclose(dh, dh_ref, rtol=1e-5, atol=1e-6)
    # the halves as [6, 5] rows of the packed tensor's stride, the gradient's halves views of one tensor
    assert stand_in == [("forward", (6, 5), (10, 1), (10, 1)), ("backward", (6, 5), (10, 1), (10, 1))]


def test_the_module_fused_equals_plain_and_counts(stand_in, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    fused, plain = make_ffn(), make_ffn()
    plain.backend = "plain"  # the stand-in resolves every backend name to fused: plain's path is below
    counters.SWIGLU.reset()
    y_fused, _ = fused(x)
    y_fused.sum().backward()
    with torch.no_grad():
        y_eval, _ = fused(x)  # no autograd: the two projections apart, the forward kernel on the pair
    force(monkeypatch, {"swiglu": None})
    y_plain, _ = plain(x)
    y_plain.sum().backward()
    assert torch.allclose(y_fused, y_plain, rtol=1e-6, atol=1e-7) and torch.allclose(y_eval, y_plain)
    for a, b in zip(fused.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    assert (counters.SWIGLU.fused, counters.SWIGLU.calls) == (2, 3)


def test_fused_pair_refuses_autograd(stand_in):
    gate = torch.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="fused_packed"):
        swiglu_fused.fused_pair(gate, torch.ones(2, 3))


def test_fused_on_cpu_is_refused_through_the_ledger():
    ffn = make_ffn()
    ffn.backend = "fused"
    with pytest.raises(ledger.FallbackRefused, match="--swiglu-backend plain") as err:
        ffn(torch.ones(1, 2, 6, dtype=torch.float64))
    assert err.value.site == "swiglu.fused_unavailable"


def test_config_resolves_and_the_model_sets_every_swiglu():
    cfg = resolve(config.build("nano", {"model": {"dropout": 0.0}}), cuda_available=False)
    assert cfg.model.swiglu_backend == "plain"
    model = DormouseLM(cfg.model, seed=0)
    ffns = [m for m in model.modules() if isinstance(m, SwiGLU)]
    assert len(ffns) == cfg.model.block_layers and {m.backend for m in ffns} == {"plain"}
    set_swiglu_backend(model, "fused")
    assert {m.backend for m in ffns} == {"fused"}
    with pytest.raises(ValueError, match="unknown swiglu backend 'apex'"):
        set_swiglu_backend(model, "apex")
    set_swiglu_backend(model, "auto")
    counters.SWIGLU.reset()
    model(torch.zeros(1, 8, dtype=torch.long))
    assert (counters.SWIGLU.fused, counters.SWIGLU.calls) == (0, cfg.model.block_layers * cfg.model.depth)
