"""The bf16 matmul of ops/projections.py on CUDA (`_Bf16Linear`, under bf16 autocast) against autocast's
own Linear: the output and the input's gradient bit for bit; the weights' gradient, now written in fp32
by the matmul, closer to the fp64 gradient than autocast's bf16-rounded one and within one bf16 rounding
of it. Skipped without CUDA."""

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from dormouse import rng  # noqa: E402
from dormouse.model.init import linear, normal_init_  # noqa: E402
from dormouse.ops.projections import affine_of, linear_of, packed, shared_casts  # noqa: E402


def case(widths, d=512, tokens=(4, 256)):
    gen = rng.generator(0, 0, "test")
    lins = tuple(linear(d, w) for w in widths)
    for lin in lins:
        normal_init_(lin.weight, gen)
    x = torch.randn(*tokens, d, generator=rng.generator(0, 1, "test")).bfloat16()
    dy = torch.randn(*tokens, sum(widths), generator=rng.generator(0, 2, "test")).bfloat16()
    return tuple(lin.cuda() for lin in lins), x.cuda(), dy.cuda()


def grads(fn, lins, x, dy):
    x = x.detach().clone().requires_grad_()
    for lin in lins:
        lin.weight.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = fn(x)
    y.backward(dy)
    return y, x.grad, torch.cat([lin.weight.grad for lin in lins])


@pytest.mark.parametrize("widths", [(512, 512, 512, 64, 8, 64), (1536, 1536), (512,)])
def test_bf16_matmul_is_autocasts_with_the_weight_gradient_in_fp32(widths):
    lins, x, dy = case(widths)
    y, dx, dw = grads(lambda x: packed(x, lins), lins, x, dy)
    ref_y, ref_dx, ref_dw = grads(lambda x: F.linear(x, torch.cat([lin.weight for lin in lins])), lins, x, dy)
    assert y.dtype == torch.bfloat16 and torch.equal(y, ref_y) and torch.equal(dx, ref_dx)
    assert dw.dtype == torch.float32
    exact = torch.einsum("bto,bti->oi", dy.double(), x.double())
    err, ref_err = (dw.double() - exact).abs().max().item(), (ref_dw.double() - exact).abs().max().item()
    print(f"weight gradient vs fp64, max|d|: fp32 matmul output {err:.3e}, autocast (bf16) {ref_err:.3e}")
    assert err < ref_err / 10
    assert torch.allclose(dw, ref_dw, rtol=2.0**-8, atol=0)


def test_a_single_linear_runs_the_same_path():
    lins, x, dy = case((512,))
    a = grads(lambda x: linear_of(x, lins[0]), lins, x, dy)
    b = grads(lambda x: packed(x, lins), lins, x, dy)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def test_affine_adds_the_bias_in_the_matmul_and_sums_its_gradient_in_fp32():
    # The KDA layer's g_b: 64 -> 512 with a bias, reading a column slice of the fused projection.
    gen = rng.generator(0, 0, "test")
    lin = torch.nn.Linear(64, 512)
    normal_init_(lin.weight, gen)
    torch.nn.init.normal_(lin.bias, std=1.0, generator=gen)
    lin = lin.cuda()
    wide = torch.randn(8, 256, 1672, generator=rng.generator(0, 1, "test")).bfloat16().cuda()
    x = wide[..., 1536:1600].requires_grad_()
    dy = torch.randn(8, 256, 512, generator=rng.generator(0, 2, "test")).bfloat16().cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = affine_of(x, lin)
    y.backward(dy)
    got = (y, x.grad, lin.weight.grad, lin.bias.grad)
    x.grad, lin.weight.grad, lin.bias.grad = None, None, None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref_y = lin(x)
    ref_y.backward(dy)
    y, dx, dw, db = got
    exact = x.double() @ lin.weight.bfloat16().double().T + lin.bias.bfloat16().double()
    assert y.dtype == torch.bfloat16 and torch.allclose(y.double(), exact, rtol=2.0**-8, atol=1e-6)
    assert torch.equal(dx, x.grad)
    exact_db = dy.double().sum((0, 1))
    err, ref_err = (db.double() - exact_db).abs().max().item(), (lin.bias.grad.double() - exact_db).abs().max().item()
    print(f"bias gradient vs fp64, max|d|: fp32 matmul {err:.3e}, autocast {ref_err:.3e}")
    assert db.dtype == torch.float32 and err <= 1e-3
    assert torch.allclose(dw, lin.weight.grad, rtol=2.0**-7, atol=1e-3)


def test_shared_casts_give_two_applications_the_unshared_bits():
    # A Linear with a bias applied twice (as the looped block applies a layer) inside shared_casts: one
    # cast of the weight for both, the outputs and every gradient bit for bit as without sharing.
    _, x, dy = case((512,))
    lin = torch.nn.Linear(512, 512).cuda()
    runs = {}
    for shared in (False, True):
        xg = x.detach().clone().requires_grad_()
        lin.weight.grad = lin.bias.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16), shared_casts() if shared else nullcontext():
            y = affine_of(affine_of(xg, lin), lin)
        y.backward(dy)
        runs[shared] = y, xg.grad, lin.weight.grad, lin.bias.grad
    assert all(torch.equal(a, b) for a, b in zip(runs[False], runs[True], strict=True))
