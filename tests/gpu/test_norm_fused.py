"""The fused RMSNorm (fla's Triton kernel) against the plain torch path on CUDA; skipped without CUDA/fla.

Both normalise in fp32 and return the input dtype. fp32 inputs: output and gradients (input, weight)
agree to 1e-5 relative (max|d|/max|ref|); bf16 inputs: to one bf16 rounding of the output (2^-8) and
1e-2 on the gradients, which pass through bf16 tensors.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
# fla through dormouse, never directly: fla reads the kernel pin's variables once, at its import, and a
# direct import before them left every kernel to Triton's timing (minutes of autotuning, other kernels).
from dormouse.ops.fla import kernels as fla_kernels  # noqa: E402

if fla_kernels.rms_norm()[0] is None:
    pytest.skip(f"needs fla-core (extra `gpu`): {fla_kernels.rms_norm()[1]}", allow_module_level=True)

from dormouse import counters, rng  # noqa: E402
from dormouse.model.model import DormouseLM  # noqa: E402
from dormouse.model.norm import GatedRMSNorm, RMSNorm  # noqa: E402
from dormouse.ops import passes  # noqa: E402
from gpu.models import nano_on_cuda  # noqa: E402 (tests/gpu/models.py)

TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2.0**-8, 1e-2)}  # (output, gradients)


def rel(x, ref):
    """max|x - ref| / max|ref| (max|x - ref| where ref is all zeros)."""
    d, scale = (x.double() - ref.double()).abs().max(), ref.double().abs().max()
    return (d / scale if scale > 0 else d).item()


def run(backend, x, w, dy):
    norm = RMSNorm(x.shape[-1], eps=1e-6).cuda()
    norm.backend = backend
    with torch.no_grad():
        norm.weight.copy_(w)
    x = x.detach().clone().requires_grad_()
    y = norm(x)
    y.backward(dy)
    return y.detach(), x.grad, norm.weight.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(4, 128, 512), (3, 7, 96)])
def test_fused_equals_plain(dtype, shape):
    gen = rng.generator(0, 0, "test")
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype).cuda()
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).cuda()
    dy = torch.randn(*shape, generator=gen).to(dtype).cuda()
    counters.NORM.reset()
    fused = run("fused", x, w, dy)
    plain = run("plain", x, w, dy)
    assert (counters.NORM.fused, counters.NORM.calls) == (1, 2)
    assert fused[0].dtype == plain[0].dtype == dtype
    out_tol, grad_tol = TOL[dtype]
    assert rel(fused[0], plain[0]) <= out_tol
    assert rel(fused[1], plain[1]) <= grad_tol, "d input"
    assert rel(fused[2], plain[2]) <= grad_tol, "d weight"


def test_model_on_cuda_runs_every_norm_fused():
    cfg = nano_on_cuda()
    assert cfg.model.norm_backend == "fused"
    model = DormouseLM(cfg.model, seed=0).cuda()
    ids = torch.randint(0, 256, (2, 64), generator=rng.generator(0, 0, "test")).cuda()
    counters.NORM.reset()
    model(ids, targets=ids).loss.backward()
    assert counters.NORM.calls > 0 and counters.NORM.fused == counters.NORM.calls


# A norm feeding one matmul (RMSNorm.feeds_one_matmul) writes bf16 itself where autocast would cast its
# fp32 output: the same arithmetic, not the same bits here (fla's autotuner keys its choice on the
# dtypes, and another block shape reduces a row in another order: not torch.equal on an H200).
# Bounded by one bf16 rounding of the output and what follows from it.
FLAGGED_TOL = {"output": 2.0**-7, "d input": 1e-2, "d weight": 1e-2}


@pytest.mark.parametrize("shape", [(64, 512, 512), (3, 7, 96)], ids=["small-b64", "ragged"])
def test_a_norm_feeding_one_matmul_changes_values_by_one_rounding(shape):
    gen = rng.generator(0, 2, "test")
    x0 = (3 * torch.randn(*shape, generator=gen)).cuda()
    w0 = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).cuda()
    lin = torch.randn(4 * shape[-1], shape[-1], generator=gen).cuda()
    results = []
    for flagged in (True, False):
        norm = RMSNorm(shape[-1], eps=1e-6).cuda()
        norm.backend, norm.feeds_one_matmul = "fused", flagged
        with torch.no_grad():
            norm.weight.copy_(w0)
        x = x0.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = norm(x)
            out = torch.nn.functional.linear(h, lin)
        assert h.dtype == (torch.bfloat16 if flagged else torch.float32)
        out.float().square().mean().backward()
        results.append((out, x.grad, norm.weight.grad))
    measured = {name: rel(a, b) for name, a, b in zip(FLAGGED_TOL, *results, strict=True)}
    print("flagged vs unflagged, max|d|/max|ref|:", measured)
    assert all(measured[name] <= tol for name, tol in FLAGGED_TOL.items()), measured


@pytest.mark.parametrize("flagged", [True, False], ids=["feeds-one-matmul", "plain-output"])
@pytest.mark.parametrize("shape", [(64, 512, 512), (3, 7, 96)], ids=["small-b64", "ragged"])
def test_add_and_norm_fused_against_plain(shape, flagged):
    # fla's kernel forms the stream + branch sum itself (the same fp32 add: equal bits), normalises it and,
    # backward, adds the sum's gradient to the norm's. The loss is linear in the norm's output and in the
    # sum, so the gradients arriving are the same on both paths: the output differs by a rounding to bf16
    # at most (where the flag writes bf16) and the gradients by fp32 reduction orders, except the bf16
    # branch's, which is one rounding of the same fp32 value (a squared loss carries the output's
    # rounding into every gradient: 1.0e-2 on the stream's on an H200).
    gen = rng.generator(0, 3, "test")
    a0 = torch.randn(*shape, generator=gen).bfloat16().cuda()
    x0 = (3 * torch.randn(*shape, generator=gen)).cuda()
    w0 = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).cuda()
    # bf16 values: the flagged output's gradient arrives in bf16 on the fused path, exactly these.
    probe_h, probe_sum = (torch.randn(*shape, generator=gen).bfloat16().float().cuda() for _ in range(2))
    results = []
    for backend in ("fused", "plain"):
        norm = RMSNorm(shape[-1], eps=1e-6).cuda()
        norm.backend, norm.feeds_one_matmul = backend, flagged
        with torch.no_grad():
            norm.weight.copy_(w0)
        a, x = a0.clone().requires_grad_(), x0.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h, mixed = norm.add_and_norm(a, x)
        assert mixed.dtype == torch.float32  # the flag writes bf16 on the fused path only
        assert h.dtype == (torch.bfloat16 if flagged and backend == "fused" else torch.float32)
        ((h.float() * probe_h).sum() + (mixed * probe_sum).sum()).backward()
        results.append((mixed, h.float(), a.grad, x.grad, norm.weight.grad))
    (mixed, *fused), (mixed_plain, *plain) = results
    assert torch.equal(mixed, mixed_plain)
    tol = {"output": 2.0**-8 if flagged else 1e-5, "d branch": 2.0**-8, "d stream": 1e-5, "d weight": 1e-5}
    measured = {name: rel(a, b) for name, a, b in zip(tol, fused, plain, strict=True)}
    print("add_and_norm fused vs plain, max|d|/max|ref|:", measured)
    assert all(measured[name] <= tol[name] for name in tol), measured


def test_the_model_step_with_the_flags_off_differs_by_roundings():
    cfg = nano_on_cuda()
    ids = torch.randint(0, 256, (2, 64), generator=rng.generator(0, 0, "test")).cuda()
    results = []
    for flags in (True, False):
        model = passes.schedule(DormouseLM(cfg.model, seed=0)).cuda()
        if not flags:
            for layer in model.layers:
                layer.mixer_norm.feeds_one_matmul = layer.ffn_norm.feeds_one_matmul = False
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, targets=ids).loss
        loss.backward()
        grads = [p.grad.to_dense() for p in model.parameters() if p.grad is not None]
        results.append((loss.detach(), grads))
    loss_rel = rel(results[0][0], results[1][0])
    grad_rel = max(rel(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))
    print(f"flags on vs off: loss {loss_rel:.3g}, worst gradient {grad_rel:.3g} (max|d|/max|ref|)")
    assert loss_rel <= 1e-3 and grad_rel <= 5e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(4, 128, 8, 64), (3, 7, 2, 64)], ids=["heads", "ragged"])
def test_the_fused_gated_norm_against_float64(dtype, shape):
    # GatedRMSNorm's fused path (fla's rms_norm_gated, sigmoid) against the formula in float64 on the
    # same inputs: within the output's one rounding, gradients as test_fused_equals_plain's.
    gen = rng.generator(0, 3, "test")
    x0 = (3 * torch.randn(*shape, generator=gen)).to(dtype).cuda()
    g0 = (2 * torch.randn(*shape, generator=gen)).to(dtype).cuda()
    w0 = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).cuda()
    dy = torch.randn(*shape, generator=gen).to(dtype).cuda()
    gated = GatedRMSNorm(shape[-1], eps=1e-6).cuda()
    gated.norm.backend = "fused"
    with torch.no_grad():
        gated.norm.weight.copy_(w0)
    x, g = x0.clone().requires_grad_(), g0.clone().requires_grad_()
    counters.NORM.reset()
    y = gated(x, g)
    y.backward(dy)
    assert (counters.NORM.fused, counters.NORM.calls) == (1, 1) and y.dtype == dtype
    xr, gr, wr = (t.detach().double().requires_grad_() for t in (x0, g0, w0))
    ref = xr * torch.rsqrt(xr.square().mean(-1, keepdim=True) + 1e-6) * wr * torch.sigmoid(gr)
    ref.backward(dy.double())
    out_tol, grad_tol = TOL[dtype]
    measured = {
        "output": rel(y.detach(), ref.detach()),
        "d input": rel(x.grad, xr.grad),
        "d gate": rel(g.grad, gr.grad),
        "d weight": rel(gated.norm.weight.grad, wr.grad),
    }
    print("fused gated norm vs float64, max|d|/max|ref|:", measured)
    assert measured["output"] <= out_tol and max(measured[k] for k in ("d input", "d gate", "d weight")) <= grad_tol


@pytest.mark.parametrize("shape", [(64 * 512, 512), (37, 96)], ids=["small-b64", "ragged"])
def test_the_add_norm_backward_kernel_against_fla_s_with_dres(shape):
    # dormouse's kernel (ops/norm/triton.py) computes what fla's layer_norm_bwd does with a residual
    # gradient: the same formula, other reduction orders (the row sums; dw's parts).
    from dormouse.ops.norm.fla import add_norm_kernels

    gen = rng.generator(0, 4, "test")
    normed = (3 * torch.randn(*shape, generator=gen)).cuda()
    dy = torch.randn(*shape, generator=gen).bfloat16().cuda()
    dsum = torch.randn(*shape, generator=gen).cuda()
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).cuda()
    rstd = normed.square().mean(-1).add(1e-6).rsqrt()
    ours = add_norm_kernels()[0].backward(dy, normed, w, rstd, dsum, torch.bfloat16)
    ops = fla_kernels.layer_norm_ops()[0]
    dx, dw, _, dres_in = ops.layer_norm_bwd(
        dy, normed, w, None, rstd=rstd, dres=dsum, has_residual=True, is_rms_norm=True, x_dtype=torch.bfloat16
    )
    assert ours[0].dtype == torch.bfloat16 and ours[1].dtype == torch.float32
    measured = {name: rel(a, b) for name, a, b in zip(("dx", "d residual", "dw"), ours, (dx, dres_in, dw), strict=True)}
    print("add-norm backward kernel vs fla's, max|d|/max|ref|:", measured)
    assert measured["dx"] <= 2.0**-8 and measured["d residual"] <= 1e-6 and measured["dw"] <= 1e-5, measured
    # no sum gradient (nothing read the sum: the head's hidden state) is a sum gradient of zeros
    kernels = add_norm_kernels()[0]
    zeros = kernels.backward(dy, normed, w, rstd, torch.zeros_like(dsum), torch.bfloat16)
    for got, want in zip(kernels.backward(dy, normed, w, rstd, None, torch.bfloat16), zeros, strict=True):
        assert torch.equal(got, want)
