"""The engram gate's kernels (ops/engram_gate/triton.py, through ops/engram_gate/) against float64
on CUDA; skipped without CUDA/Triton.

The kernels compute the gate and its gradients in fp32 from the inputs and round once at each output:
against the float64 gate of the same inputs, max|d|/max|ref| within 1e-5 for the fp32 outputs (h's
gradient, the gains', everything with fp32 inputs) and within one bf16 rounding (2^-8) for the bf16 ones
(the gated value, [v | k]'s gradient); in bf16 no worse than the plain path, which rounds the normalised
key and α to bf16. Also: a model on CUDA runs the gate fused, its loss and gradients near the plain
path's.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
from dormouse.ops import engram_gate  # noqa: E402
from dormouse.ops.engram_gate import fused as gate_fused  # noqa: E402

if gate_fused.fused_kernels()[0] is None:
    pytest.skip(f"needs Triton (extra `gpu`): {gate_fused.fused_kernels()[1]}", allow_module_level=True)

from float64_references import gate_grads  # noqa: E402 (tests/float64_references.py)

from dormouse import counters, rng  # noqa: E402
from dormouse.model.init import linear, normal_init_  # noqa: E402
from dormouse.model.model import DormouseLM  # noqa: E402
from dormouse.model.norm import RMSNorm  # noqa: E402
from dormouse.ops import projections  # noqa: E402
from gpu.models import nano_on_cuda  # noqa: E402 (tests/gpu/models.py)

TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8}
EPS = 1e-6


def rel(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max()).item()


def gains(d):
    return [(1.5 + 0.3 * torch.randn(d, generator=rng.generator(0, i, "test"))).cuda() for i in range(2)]


def reference(h, vk, w_h, w_k, g):
    """(gated, grads of h, vk, w_h, w_k) in float64 by autograd, from the same values."""
    return gate_grads(h, vk, w_h, w_k, g, EPS, EPS)


def inputs(bt, d, dtype):
    gen = rng.generator(0, 1, "test")
    h = (3 * torch.randn(*bt, d, generator=gen)).cuda().requires_grad_()
    vk = (0.1 * torch.randn(*bt, 2 * d, generator=gen)).to(dtype).cuda().requires_grad_()
    # a gradient with a row stride of its own: the kernel reads it through it
    g = torch.randn(*bt, d + 3, generator=gen).to(dtype).cuda()[..., :d]
    return h, vk, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(64, 512, 512), (3, 7, 48)], ids=["small-b64", "ragged"])
def test_the_kernels_against_float64(dtype, shape):
    *bt, d = shape
    h, vk, g = inputs(bt, d, dtype)
    w_h, w_k = (w.requires_grad_() for w in gains(d))
    out = gate_fused._gate_packed(h, vk, w_h, w_k, EPS, EPS)
    got = torch.autograd.grad(out, [h, vk, w_h, w_k], g)
    ref_out, want = reference(h, vk, w_h, w_k, g)
    assert out.dtype == got[1].dtype == dtype and got[0].dtype == got[2].dtype == torch.float32
    assert rel(out, ref_out) <= TOL[dtype]
    for name, x, ref in zip(("h", "vk", "w_h", "w_k"), got, want, strict=True):
        assert rel(x, ref) <= TOL[x.dtype], (name, rel(x, ref))


def test_fused_is_no_worse_than_plain_in_bf16():
    # Through `gate` under autocast, both paths read the same [v | k] (one matmul of e): against the float64
    # gate of those values, the fused path's output and h's gradient are at least as close as the plain
    # path's, which rounds the normalised key and α to bf16.
    d, arms_dim, bt = 512, 384, (8, 512)
    gen = rng.generator(0, 2, "test")
    e = torch.randn(*bt, arms_dim, generator=gen).cuda()
    h = (3 * torch.randn(*bt, d, generator=gen)).cuda()
    g = torch.randn(*bt, d, generator=gen).to(torch.bfloat16).cuda()
    w_v, w_k = (linear(arms_dim, d).cuda() for _ in range(2))
    for lin in (w_v, w_k):
        normal_init_(lin.weight, gen)
    errors = {}
    for backend in ("fused", "plain"):
        hidden_norm, key_norm = RMSNorm(d, EPS).cuda(), RMSNorm(d, EPS).cuda()
        with torch.no_grad():
            for norm, w in zip((hidden_norm, key_norm), gains(d), strict=True):
                norm.weight.copy_(w)
                norm.backend = backend
        hb = h.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = engram_gate.gate(hb, e, w_v, w_k, hidden_norm, key_norm)
            vk = projections.packed(e, (w_v, w_k))
        (dh,) = torch.autograd.grad(out, hb, g)
        ref_out, (ref_dh, *_) = reference(h, vk, hidden_norm.weight, key_norm.weight, g)
        errors[backend] = rel(out, ref_out), rel(dh, ref_dh)
    assert errors["fused"][0] <= TOL[torch.bfloat16]
    assert all(f <= p for f, p in zip(errors["fused"], errors["plain"], strict=True)), errors


def test_model_on_cuda_runs_the_gate_fused_and_matches_plain():
    cfg = nano_on_cuda()
    assert cfg.model.engram and cfg.model.norm_backend == "fused"
    ids = torch.randint(0, 256, (2, 64), generator=rng.generator(0, 0, "test")).cuda()
    results = {}
    for backend in ("fused", "plain"):
        model = DormouseLM(cfg.model, seed=0).cuda()
        for _, memory in model.memories():
            memory.key_norm.backend = memory.hidden_norm.backend = backend
        counters.NORM.reset()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, targets=ids).loss
        loss.backward()
        assert counters.NORM.calls - counters.NORM.fused == (0 if backend == "fused" else 2)
        dense = [p.grad.flatten() for p in model.parameters() if p.grad is not None and not p.grad.is_sparse]
        results[backend] = (loss.item(), torch.cat(dense))
    (loss_f, grad_f), (loss_p, grad_p) = results["fused"], results["plain"]
    assert abs(loss_f - loss_p) <= 1e-3 * abs(loss_p)
    assert rel(grad_f, grad_p.double()) <= 2e-2
