"""RMSNorm's backend policy on the CPU: plain torch here; asking for the fused kernel is refused, loudly.

The fused path's numbers (output and gradients equal to plain) are tests/gpu/test_norm_fused.py.
"""

import pytest
import torch
from backend_stand_in import force

from dormouse import config, counters, ledger
from dormouse.model.model import DormouseLM
from dormouse.model.norm import GatedRMSNorm, RMSNorm, set_norm_backend
from dormouse.ops import passes
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.norm import fla as norm_fla
from dormouse.resolve import resolve


def test_plain_matches_the_formula_in_float64():
    x = torch.tensor([[3.0, -4.0], [1.0, 1.0]], dtype=torch.float64)
    norm = RMSNorm(2, eps=0.0).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.5]))
    # rms of (3, -4) is sqrt(12.5); of (1, 1) is 1
    expected = torch.tensor([[2 * 3 / 12.5**0.5, 0.5 * -4 / 12.5**0.5], [2.0, 0.5]], dtype=torch.float64)
    assert torch.allclose(norm(x), expected, rtol=0, atol=1e-15)


def test_fused_on_cpu_is_refused_through_the_ledger():
    assert ledger.SITES["norm.fused_unavailable"].kind is ledger.Kind.LOUD
    norm = RMSNorm(4)
    norm.backend = "fused"
    with pytest.raises(ledger.FallbackRefused, match="--norm-backend plain") as err:
        norm(torch.ones(2, 4))
    assert err.value.site == "norm.fused_unavailable"


def test_config_resolves_and_the_model_sets_every_norm():
    arms = {"attn_res": True, "engram": True, "dropout": 0.0}  # the engram's norms too
    cfg = resolve(config.build("nano", {"model": arms}), cuda_available=False)
    assert cfg.model.norm_backend == "plain"
    model = DormouseLM(cfg.model, seed=0)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) > 3 and {m.backend for m in norms} == {"plain"}
    set_norm_backend(model, "fused")
    assert {m.backend for m in norms} == {"fused"}
    counters.NORM.reset()
    set_norm_backend(model, "auto")
    model(torch.zeros(1, 8, dtype=torch.long))
    assert counters.NORM.fused == 0 and counters.NORM.calls >= len(norms)  # each norm ran, none fused


def stand_in_ops(calls):
    """fla's layer_norm_fwd / layer_norm_bwd for RMSNorm (no bias), in torch, as fla documents them: fp32
    inside, the output written in `out_dtype`, dx in `x_dtype`; with a residual, the norm of x + residual
    (the sum returned in residual's dtype) and, backward, the sum's gradient `dres` added to dx (dres_in:
    that in x's dtype, dx itself where the dtypes agree)."""

    def fwd(x, weight, bias, eps, residual=None, out_dtype=None, is_rms_norm=False):
        calls.append(("fwd", x.shape, out_dtype, is_rms_norm))
        normed = x if residual is None else (x.float() + residual.float()).to(residual.dtype)
        rstd = torch.rsqrt(normed.float().pow(2).mean(-1) + eps)
        return (normed.float() * rstd[:, None] * weight).to(out_dtype or x.dtype), None, rstd, normed

    def bwd(dy, x, weight, bias, rstd=None, dres=None, has_residual=False, is_rms_norm=False, x_dtype=None):
        calls.append(("bwd", dy.dtype, is_rms_norm, x_dtype))
        with torch.enable_grad():  # a backward runs without grad mode
            xf = x.detach().float().requires_grad_()
            wf = weight.detach().float().requires_grad_()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * wf
            dx, dw = torch.autograd.grad(y, (xf, wf), dy.float())
        if dres is not None:
            dx = dx + dres.float()
        out = dx.to(x_dtype)
        dres_in = None if not has_residual else out if x_dtype == x.dtype else dx.to(x.dtype)
        return out, dw, None, dres_in

    return type("Ops", (), {"layer_norm_fwd": staticmethod(fwd), "layer_norm_bwd": staticmethod(bwd)})


def stand_in_add_norm_kernels(ops):
    """ops/norm/triton.py's backward as fla's layer_norm_bwd with `dres` computes it (the same arithmetic)."""

    def backward(dy, normed, weight, rstd, dsum, x_dtype):
        dx, dw, _, dres_in = ops.layer_norm_bwd(dy, normed, weight, None, rstd, dsum, True, True, x_dtype)
        return dx, dres_in, dw

    return type("Kernels", (), {"backward": staticmethod(backward)})


def fused_by_stand_ins(monkeypatch, ops) -> None:
    """The fused norm paths chosen, fla's kernels and dormouse's add-norm backward replaced by `ops`."""

    def rms_norm(x, weight, bias, eps):  # fla's rms_norm: the same kernel, the input's dtype out
        return ops.layer_norm_fwd(x.reshape(-1, x.shape[-1]), weight, bias, eps)[0].view(x.shape)

    monkeypatch.setattr(fla_kernels, "layer_norm_ops", lambda: (ops, ""))
    monkeypatch.setattr(fla_kernels, "rms_norm", lambda: (rms_norm, ""))
    monkeypatch.setattr(norm_fla, "add_norm_kernels", lambda: (stand_in_add_norm_kernels(ops), ""))
    force(monkeypatch, {"norm": "fused"})


def weighted_norm(weight: torch.Tensor, feeds_one_matmul: bool) -> RMSNorm:
    n = RMSNorm(weight.numel(), eps=1e-6)
    n.feeds_one_matmul = feeds_one_matmul
    with torch.no_grad():
        n.weight.copy_(weight)
    return n


def test_a_norm_feeding_one_matmul_writes_autocast_dtype_with_the_same_values(monkeypatch):
    # On the fused path under autocast the norm hands the matmul what autocast's cast would have (the fp32
    # output rounded once to bf16) and takes the bf16 gradient as the cast's backward would (exactly):
    # with kernels whose arithmetic ignores the output dtype (these stand-ins) the matmul's output and
    # every gradient equal the unflagged norm's bit for bit. fla's own kernels pick their block shapes by
    # dtype, so on the GPU the bits may differ by a rounding (tests/gpu/test_norm_fused.py).
    calls = []
    fused_by_stand_ins(monkeypatch, stand_in_ops(calls))
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 3, 8, generator=gen)
    w0 = 1 + 0.1 * torch.randn(8, generator=gen)
    lin = torch.randn(5, 8, generator=gen)
    results = []
    for flagged in (True, False):
        n = weighted_norm(w0, flagged)
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = n(x)
            out = torch.nn.functional.linear(h, lin)
        assert h.dtype == (torch.bfloat16 if flagged else torch.float32)
        out.float().square().sum().backward()
        results.append((out, x.grad, n.weight.grad))
    assert calls[:2] == [("fwd", (6, 8), torch.bfloat16, True), ("bwd", torch.bfloat16, True, torch.float32)]
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("flagged", [True, False], ids=["feeds-one-matmul", "plain-output"])
def test_add_and_norm_fused_equals_the_add_then_the_norm(monkeypatch, flagged):
    # One kernel each way (fla's forward with its residual, dormouse's backward: these stand-ins compute as
    # fla documents its `residual` and `dres`) against a separate fp32 add of the bf16 branch into the fp32
    # stream, then the norm: the sum, the output and every gradient (branch, stream, weight) bit for bit, as
    # the arithmetic is the same.
    fused_by_stand_ins(monkeypatch, stand_in_ops([]))
    gen = torch.Generator().manual_seed(0)
    a0 = torch.randn(2, 3, 8, generator=gen).bfloat16()
    x0 = 3 * torch.randn(2, 3, 8, generator=gen)
    w0 = 1 + 0.1 * torch.randn(8, generator=gen)
    lin = torch.randn(5, 8, generator=gen)
    results = []
    for together in (True, False):
        n = weighted_norm(w0, flagged)
        a, x = a0.clone().requires_grad_(), x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if together:
                h, mixed = n.add_and_norm(a, x)
            else:
                mixed = x + a
                h = n(mixed)
            out = torch.nn.functional.linear(h, lin)
        assert mixed.dtype == torch.float32 and h.dtype == (torch.bfloat16 if flagged else torch.float32)
        (out.float().square().sum() + mixed.sin().sum()).backward()  # the sum feeds the stream too
        results.append((mixed, out, a.grad, x.grad, n.weight.grad))
    assert results[0][2].dtype == torch.bfloat16 and results[0][3].dtype == torch.float32
    for name, got, want in zip(("sum", "out", "d branch", "d stream", "d weight"), *results, strict=True):
        assert torch.equal(got, want), name


def test_add_and_norm_for_the_head_writes_bf16_and_a_sum_nobody_reads_gets_no_gradient(monkeypatch):
    # The final norm for the head (`sum_feeds_one_matmul`: its add-and-norm only) writes autocast's dtype; the hidden
    # state it returns beside is not read, so its backward kernel gets no sum gradient (None, not a
    # tensor of zeros to fill and read), and the gradients equal the separate add and norm's.
    ops = stand_in_ops([])
    fused_by_stand_ins(monkeypatch, ops)
    seen = []
    kernels = stand_in_add_norm_kernels(ops)

    def backward(dy, normed, weight, rstd, dsum, x_dtype):
        seen.append(dsum)
        return kernels.backward(dy, normed, weight, rstd, dsum, x_dtype)

    monkeypatch.setattr(norm_fla, "add_norm_kernels", lambda: (type("K", (), {"backward": staticmethod(backward)}), ""))
    gen = torch.Generator().manual_seed(0)
    a0, x0 = torch.randn(2, 3, 8, generator=gen).bfloat16(), 3 * torch.randn(2, 3, 8, generator=gen)
    lin = torch.randn(5, 8, generator=gen)
    results = []
    for together in (True, False):
        n = weighted_norm(torch.ones(8), False)
        n.sum_feeds_one_matmul = True
        a, x = a0.clone().requires_grad_(), x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if together:
                h, _ = n.add_and_norm(a, x)
                assert h.dtype == torch.bfloat16
            else:
                h = n(x + a).bfloat16()
            out = torch.nn.functional.linear(h, lin)
        out.float().square().sum().backward()
        results.append((out, a.grad, x.grad, n.weight.grad))
    assert seen == [None]
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)


def test_add_and_norm_plain_is_the_sum_then_the_norm_and_refuses_a_narrower_stream():
    gen = torch.Generator().manual_seed(1)
    n = RMSNorm(8, eps=1e-6)
    a, x = torch.randn(4, 8, generator=gen).bfloat16(), torch.randn(4, 8, generator=gen)
    h, mixed = n.add_and_norm(a, x)
    assert torch.equal(mixed, x + a.float()) and torch.equal(h, n(x + a.float()))
    with pytest.raises(ValueError, match="narrower"):
        n.add_and_norm(x, a)


def test_the_kernel_pass_flags_the_norms_that_feed_one_matmul():
    def flags(**model):
        cfg = resolve(config.build("nano", {"model": model}), cuda_available=False)
        built = DormouseLM(cfg.model)
        assert not any(getattr(m, "feeds_one_matmul", False) for m in built.modules())  # the model sets none
        layers = passes.schedule(built).layers
        assert built.final_norm.sum_feeds_one_matmul and not built.final_norm.feeds_one_matmul
        return {(l.mixer_norm.feeds_one_matmul, l.ffn_norm.feeds_one_matmul) for l in layers}

    assert flags() == {(True, True)}
    assert flags(n_experts=2) == {(True, False)}  # the experts accumulate in the input's dtype
    assert flags(mixer="attention") == {(False, True)}  # attention's three Linears read it


def test_the_gated_norm_runs_fla_s_gated_kernel_on_the_fused_path(monkeypatch):
    # The fused GatedRMSNorm is one call of fla's rms_norm_gated with the sigmoid activation and the
    # norm's own weight and eps (a float64 stand-in here), counted once; the fused refusal is the norm's.
    calls = []

    def rms_norm_gated(x, g, weight, bias, activation="swish", eps=1e-6):
        calls.append((activation, bias, eps))
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight * torch.sigmoid(g)

    gated = GatedRMSNorm(4, eps=1e-5).double()
    with torch.no_grad():
        gated.norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
    x = torch.tensor([[3.0, -4.0, 0.0, 1.0]], dtype=torch.float64)
    gate = torch.tensor([[0.0, 1.0, -2.0, 3.0]], dtype=torch.float64)
    gated.norm.backend = "fused"
    with pytest.raises(ledger.FallbackRefused, match="--norm-backend plain"):
        gated(x, gate)  # on the CPU: refused at norm.fused_unavailable
    monkeypatch.setattr(fla_kernels, "rms_norm_gated", lambda: (rms_norm_gated, ""))
    force(monkeypatch, {"norm": None, "norm.gated": None})
    counters.NORM.reset()
    y = gated(x, gate)
    assert calls == [("sigmoid", None, 1e-5)] and (counters.NORM.fused, counters.NORM.calls) == (1, 1)
    rms = (26.0 / 4 + 1e-5) ** 0.5  # squares 9 + 16 + 0 + 1
    sig = 1 / (1 + torch.exp(-gate[0]))
    expected = torch.tensor([3.0, -8.0, 0.0, -1.0], dtype=torch.float64) / rms * sig
    assert torch.allclose(y[0], expected, rtol=0, atol=1e-15)
    gated.norm.backend = "plain"  # the torch path gives the same function
    assert torch.allclose(gated(x, gate)[0], expected, rtol=0, atol=1e-15)


def test_add_and_norm_fused_backward_without_its_kernel_is_refused_through_the_ledger(monkeypatch):
    fused_by_stand_ins(monkeypatch, stand_in_ops([]))
    monkeypatch.setattr(norm_fla, "add_norm_kernels", lambda: (None, "ModuleNotFoundError: No module named 'triton'"))
    n = weighted_norm(torch.ones(8), False)
    a = torch.randn(2, 8, generator=torch.Generator().manual_seed(0)).requires_grad_()
    h, _ = n.add_and_norm(a, torch.ones(2, 8))
    with pytest.raises(ledger.FallbackRefused, match="needs Triton.*--norm-backend plain") as err:
        h.sum().backward()
    assert err.value.site == "norm.fused_unavailable"
