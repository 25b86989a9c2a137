"""The fused short conv (dormouse's Triton kernels, ops/short_conv/triton.py) on CUDA; skipped without
CUDA or Triton.

The kernels against float64 on the same inputs: fp32 output and gradients to 1e-5 relative
(max|d|/max|ref|); bf16 output and input gradient to one bf16 rounding (2^-8), the weight's gradient
(summed in fp32) to 1e-5. Shapes: the model's, shorter than the kernel, and ragged (positions and
channels not multiples of the blocks); widths 4, 3, 2 (zeros in front of the weights); the input a slice
of a wider tensor; dilations 1, 4 (the engram's) and 3. Two backward runs give the same bits. q, k, v as three slices of
one projection in one launch each way, q and k L2-normalised per head, against float64 in the same
tolerances. Also: the fused Function against the plain path (with and without the norm), and a model on
CUDA running every conv fused.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from dormouse.model.short_conv import ShortConv, set_conv_backend  # noqa: E402
from dormouse.ops import short_conv  # noqa: E402
from dormouse.ops.short_conv import fused as conv_fused  # noqa: E402

kernels, why = conv_fused.fused_kernels()
if kernels is None:
    pytest.skip(f"needs Triton (extra `gpu`): {why}", allow_module_level=True)

import float64_references as f64  # noqa: E402 (tests/float64_references.py)

from dormouse import counters, rng  # noqa: E402
from dormouse.model.model import DormouseLM  # noqa: E402
from dormouse.ops.norm.reference import l2norm  # noqa: E402
from gpu.models import nano_on_cuda  # noqa: E402 (tests/gpu/models.py)

TOL = {torch.float32: (1e-5, 1e-5, 1e-5), torch.bfloat16: (2.0**-8, 2.0**-8, 1e-5)}  # (y, dx, dw)


def rel(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def reference(x, w, dy, dilation=1):
    """float64 SiLU(causal depthwise conv), its input's and weight's gradients (tests/float64_references.py)."""
    return f64.conv(x, w, 1, dilation)[0], *f64.conv_grads(x, w, (dy,), 1, dilation)


@pytest.mark.parametrize("dilation", [1, 4, 3], ids=["dil1", "dil4", "dil3"])
@pytest.mark.parametrize("width", [4, 3, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(64, 256, 512), (3, 2, 96), (2, 100, 200)], ids=["model", "short", "ragged"])
def test_kernels_against_float64(shape, dtype, width, dilation):
    B, T, C = shape
    gen = rng.generator(0, 0, "test")
    wide = torch.randn(B, T, 3 * C + 8, generator=gen).to(dtype).cuda()
    x = wide[..., C : 2 * C]  # a slice, as q, k, v of the packed projection
    w = (0.5 * torch.randn(C, width, generator=gen)).cuda()
    dy = torch.randn(B, T, C, generator=gen).to(dtype).cuda()
    y = kernels.forward(x, w, dilation=dilation)[0][0]
    dx = torch.empty_like(dy)
    dw = kernels.backward(x, w, (dy,), dx, dilation)
    y_ref, dx_ref, dw_ref = reference(x, w, dy, dilation)
    measured = {"y": rel(y, y_ref), "dx": rel(dx, dx_ref), "dw": rel(dw, dw_ref)}
    print(f"{shape} {dtype} width {width} dilation {dilation}, max|d|/max|ref|: {measured}")
    assert y.dtype == dx.dtype == dtype and dw.dtype == torch.float32 and dw.shape == (C, width)
    assert all(m <= tol for m, tol in zip(measured.values(), TOL[dtype], strict=True)), measured
    dx_again = torch.empty_like(dy)
    assert torch.equal(kernels.backward(x, w, (dy,), dx_again, dilation), dw) and torch.equal(dx_again, dx)


def packed_reference(wide, w, dys, norm, head):
    """float64 q, k, v: SiLU(conv) of wide's three C-channel slices, the first `norm` L2-normalised over each
    `head` channels; the gradients of wide's 3C channels and of w [3C, W]; the normalised heads' 1 / norm
    [norm, B, T, C / head] (tests/float64_references.py)."""
    y = f64.conv(wide[..., : w.shape[0]], w, 3, 1, norm, head)
    return y, *f64.conv_grads(wide, w, dys, 3, 1, norm, head), f64.head_rstd(wide, w, 3, norm, head, kernels.NORM_EPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("shape", "head"), [((64, 256, 512), 64), ((2, 100, 96), 32), ((3, 50, 256), 128)])
def test_packed_kernels_normalising_q_and_k_against_float64(shape, head, dtype):
    # One launch each way over q, k, v (three slices of one projection, 40 more channels after them), q and k
    # L2-normalised per head inside: the same tolerances as one conv; the 40 channels' gradient untouched.
    B, T, C = shape
    gen = rng.generator(0, 2, "test")
    wide = torch.randn(B, T, 3 * C + 40, generator=gen).to(dtype).cuda()
    w = (0.5 * torch.randn(3 * C, 4, generator=gen)).cuda()
    dys = tuple(torch.randn(B, T, C, generator=gen).to(dtype).cuda() for _ in range(3))
    y, rstd = kernels.forward(wide, w, 3, 1, 2, head)
    dx = torch.zeros_like(wide)
    dw = kernels.backward(wide, w, dys, dx, 1, 2, head, rstd)
    y_ref, dx_ref, dw_ref, rstd_ref = packed_reference(wide, w, dys, 2, head)
    measured = {"y": rel(y, y_ref), "dx": rel(dx[..., : 3 * C], dx_ref), "dw": rel(dw, dw_ref)}
    print(f"{shape} head {head} {dtype}, max|d|/max|ref|: {measured}")
    assert y.shape == (3, B, T, C) and dw.shape == (3 * C, 4) and not dx[..., 3 * C :].any()
    assert all(m <= tol for m, tol in zip(measured.values(), TOL[dtype], strict=True)), measured
    dx_again = torch.zeros_like(wide)
    assert torch.equal(kernels.backward(wide, w, dys, dx_again, 1, 2, head, rstd), dw) and torch.equal(dx_again, dx)
    # the heads' 1 / norm the forward kept for the backward (q's and k's) against float64
    assert rstd.shape == (2, B, T, C // head) and rstd.dtype == torch.float32
    assert rel(rstd, rstd_ref) <= 1e-5, rel(rstd, rstd_ref)


def test_packed_backward_takes_fp32_and_bf16_gradients_in_one_call():
    # q's and k's gradients in fp32 (fla's, through the sinks: ops/kda/fla.py), v's in bf16 on a bf16
    # projection: one launch per run of one dtype. Against float64 of the same gradients, and the bf16
    # tolerances; the fp32 gradients are read as given (rounding them to bf16 first gives other bits).
    B, T, C, head = 64, 256, 512, 64
    gen = rng.generator(0, 3, "test")
    wide = torch.randn(B, T, 3 * C + 40, generator=gen).bfloat16().cuda()
    w = (0.5 * torch.randn(3 * C, 4, generator=gen)).cuda()
    dq, dk = (torch.randn(B, T, C, generator=gen).cuda() for _ in range(2))
    dv = torch.randn(B, T, C, generator=gen).bfloat16().cuda()
    y, rstd = kernels.forward(wide, w, 3, 1, 2, head)
    dx, dx_rounded = torch.zeros_like(wide), torch.zeros_like(wide)
    dw = kernels.backward(wide, w, (dq, dk, dv), dx, 1, 2, head, rstd)
    kernels.backward(wide, w, (dq.bfloat16(), dk.bfloat16(), dv), dx_rounded, 1, 2, head, rstd)
    _, dx_ref, dw_ref, _ = packed_reference(wide, w, (dq, dk, dv), 2, head)
    measured = {"dx": rel(dx[..., : 3 * C], dx_ref), "dw": rel(dw, dw_ref)}
    print(f"fp32 q, k and bf16 v gradients, max|d|/max|ref|: {measured}")
    assert all(m <= tol for m, tol in zip(measured.values(), TOL[torch.bfloat16][1:], strict=True)), measured
    assert not torch.equal(dx, dx_rounded) and not dx[..., 3 * C :].any()


def test_the_refusal_s_width_is_the_kernels_window():
    assert kernels.TAPS == short_conv.MAX_FUSED_WIDTH


@pytest.mark.parametrize("norm", [0, 2])
def test_packed_convs_fused_against_the_plain_path(norm):
    # In bf16 the plain path rounds the weights, and the conv before its SiLU (and its norm's input):
    # roundings apart, bounded by 1e-2 as the other fused-against-plain tests' gradients are.
    gen = rng.generator(0, 1, "test")
    B, T, C = 4, 128, 256
    h0 = torch.randn(B, T, 3 * C + 40, generator=gen).to(torch.bfloat16).cuda()
    dys = [torch.randn(B, T, C, generator=gen).to(torch.bfloat16).cuda() for _ in range(3)]
    drest = torch.randn(B, T, 40, generator=gen).to(torch.bfloat16).cuda()
    results = []
    for backend in ("fused", "plain"):
        convs = tuple(ShortConv(C, 4).cuda() for _ in range(3))
        for i, conv in enumerate(convs):
            with torch.no_grad():
                conv.weight.copy_(0.5 * torch.randn(conv.weight.shape, generator=rng.generator(0, i, "test")))
        set_conv_backend(torch.nn.ModuleList(convs), backend)
        h = h0.clone().requires_grad_()
        counters.CONV.reset()
        c = short_conv.convolve_packed(h, tuple(c.weight for c in convs), backend, (40,), norm=norm, head=64)
        *outs, rest = c.outs
        for i in range(0 if c.normed else norm):  # the plain path leaves the norm to its caller
            outs[i] = l2norm(outs[i].unflatten(-1, (-1, 64))).flatten(-2).to(outs[i].dtype)
        assert counters.CONV.fused == (3 if backend == "fused" else 0)
        loss = sum((o.float() * dy.float()).sum() for o, dy in zip(outs, dys, strict=True))
        (loss + (rest.float() * drest.float()).sum()).backward()
        results.append((*outs, rest, h.grad, *(c.weight.grad for c in convs)))
    names = ("q", "k", "v", "rest", "d projection", "dw q", "dw k", "dw v")
    measured = {name: rel(a, b) for name, a, b in zip(names, *results, strict=True)}
    print("fused vs plain, max|d|/max|ref|:", measured)
    assert measured["rest"] == 0 and max(measured.values()) <= 1e-2, measured


def test_model_on_cuda_runs_every_conv_fused():
    cfg = nano_on_cuda()
    assert cfg.model.conv_backend == "fused"
    model = DormouseLM(cfg.model, seed=0).cuda()
    ids = torch.randint(0, 256, (2, 64), generator=rng.generator(0, 0, "test")).cuda()
    counters.CONV.reset()
    model(ids, targets=ids).loss.backward()
    # the KDA layers' convs at every loop iteration, and the engram's (EngramConv: dilation 4) once
    assert counters.CONV.calls == 3 * cfg.model.block_layers * cfg.model.depth + 1 == counters.CONV.fused
