"""project(): several bias-free Linears reading one input as one matmul."""

from contextlib import nullcontext

import torch
from torch.profiler import ProfilerActivity, profile

from dormouse import rng
from dormouse.model.init import linear, normal_init_
from dormouse.model.model import DormouseLM
from dormouse.ops import passes, projections
from dormouse.ops.projections import project


def linears(widths, d=16):
    gen = rng.generator(0, 0, "test")
    out = tuple(linear(d, w).double() for w in widths)
    for lin in out:
        normal_init_(lin.weight, gen)
    return out


def test_project_equals_each_linear_with_its_gradients():
    lins = linears((16, 4, 1))
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=rng.generator(0, 1, "test"), requires_grad=True)
    outs = project(x, lins)
    cotangents = [torch.randn(o.shape, dtype=torch.float64, generator=rng.generator(0, 2, "test")) for o in outs]
    torch.autograd.backward(outs, cotangents)
    got = (x.grad.clone(), *(lin.weight.grad.clone() for lin in lins))
    x.grad = None
    for lin in lins:
        lin.weight.grad = None
    refs = [lin(x) for lin in lins]
    torch.autograd.backward(refs, cotangents)
    for out, ref in zip(outs, refs, strict=True):
        assert out.shape == ref.shape and torch.allclose(out, ref, rtol=1e-13, atol=1e-15)
    for g, ref in zip(got, (x.grad, *(lin.weight.grad for lin in lins)), strict=True):
        assert torch.allclose(g, ref, rtol=1e-13, atol=1e-15)


def test_under_autocast_the_input_is_cast_once_forward_and_its_gradient_once_back():
    lins = tuple(lin.float() for lin in linears((12, 12, 12, 4, 2, 4)))
    x = torch.randn(2, 8, 16, generator=rng.generator(0, 1, "test"), requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            outs = project(x, lins)
        sum(o.float().sum() for o in outs).backward()
    casts_of_x = [e for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes[0] == [2, 8, 16]]
    assert len(casts_of_x) == 2  # x to bf16 and its gradient back to fp32 (as six Linears: 12, measured)


def test_without_autograd_each_linear_runs_alone_and_no_weight_is_copied():
    lins = linears((16, 4, 1))
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=rng.generator(0, 1, "test"))
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        outs = project(x, lins)
    for out, lin in zip(outs, lins, strict=True):
        assert torch.equal(out, x @ lin.weight.T)
    assert not [e for e in prof.events() if e.name == "aten::cat"]


def _bf16_path_on_cpu(monkeypatch):
    """The CUDA bf16 path on the CPU: its fp32-output matmul stood in by an fp64 product rounded to fp32."""
    monkeypatch.setattr(projections, "bf16_matmul", lambda x: True)
    monkeypatch.setattr(projections, "_mm_fp32", lambda a, b: (a.double() @ b.double()).float())


def test_bf16_affine_adds_the_bias_in_the_matmul_and_sums_its_gradient_in_fp32(monkeypatch):
    # The CUDA bf16 path (_Bf16Linear with a bias) on the CPU: the fp32-output matmul, which torch has
    # only on CUDA, stood in by an fp64 product rounded to fp32. Input: a column slice of a wider tensor,
    # as the KDA layer's g_b reads its low-rank half. The output is the fp64 result within one bf16
    # rounding (the bias added before rounding); the bias's gradient is the fp64 column sum of the
    # (bf16) output gradient to fp32 rounding.
    _bf16_path_on_cpu(monkeypatch)
    gen = rng.generator(0, 0, "test")
    lin = torch.nn.Linear(8, 24)
    normal_init_(lin.weight, gen)
    torch.nn.init.normal_(lin.bias, std=1.0, generator=gen)
    wide = torch.randn(3, 40, 20, generator=rng.generator(0, 1, "test")).bfloat16()
    x = wide[..., 4:12].requires_grad_()
    dy = torch.randn(3, 40, 24, generator=rng.generator(0, 2, "test")).bfloat16()
    y = projections.affine_of(x, lin)
    y.backward(dy)
    exact = x.double() @ lin.weight.bfloat16().double().T + lin.bias.bfloat16().double()
    assert y.dtype == torch.bfloat16 and y.shape == (3, 40, 24)
    assert torch.allclose(y.double(), exact, rtol=2.0**-8, atol=0)
    assert lin.bias.grad.dtype == torch.float32
    assert torch.allclose(lin.bias.grad.double(), dy.double().sum((0, 1)), rtol=2.0**-23, atol=1e-6)
    assert torch.allclose(lin.weight.grad.double(), torch.einsum("bto,bti->oi", dy.double(), x.double()), rtol=1e-6)
    assert torch.equal(x.grad, dy @ lin.weight.bfloat16())


def test_shared_casts_cast_a_group_once_for_all_its_applications_with_the_same_bits(monkeypatch):
    # Two applications of one Linear with a bias (as the looped block applies a layer): shared, one cast
    # of the weight (not two); the outputs and every gradient bit for bit as unshared.
    _bf16_path_on_cpu(monkeypatch)
    gen = rng.generator(0, 0, "test")
    lin = torch.nn.Linear(24, 24)
    normal_init_(lin.weight, gen)
    torch.nn.init.normal_(lin.bias, std=1.0, generator=gen)
    x = torch.randn(3, 40, 24, generator=rng.generator(0, 1, "test")).bfloat16()
    dy = torch.randn(3, 40, 24, generator=rng.generator(0, 2, "test")).bfloat16()
    runs = {}
    for shared in (False, True):
        xg = x.clone().requires_grad_()
        lin.weight.grad = lin.bias.grad = None
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            with projections.shared_casts() if shared else nullcontext():
                y = projections.affine_of(projections.affine_of(xg, lin), lin)
            y.backward(dy)
        casts = [e for e in prof.events() if e.name == "aten::cat" and e.input_shapes[0] == []]  # [W], a list
        assert len(casts) == (1 if shared else 2)
        runs[shared] = y, xg.grad, lin.weight.grad, lin.bias.grad
    assert all(torch.equal(a, b) for a, b in zip(runs[False], runs[True], strict=True))


def test_the_looped_model_with_shared_casts_is_bit_for_bit_the_unshared_one(monkeypatch):
    # A depth-2 model on the bf16 path (CPU stand-ins): the kernel pass (ops/passes.py) shares each layer's
    # cast between its two applications; the loss and every gradient are the unshared model's.
    from test_model import ids, tiny

    _bf16_path_on_cpu(monkeypatch)
    x, y = ids(2, 24), ids(2, 24, step=1)
    runs = {}
    for shared in (False, True):
        model = DormouseLM(tiny(depth=2))
        if shared:
            passes.schedule(model)  # its norm hints change nothing on the CPU's plain norms
        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss = model(x, y).loss
        loss.backward()
        casts = [e for e in prof.events() if e.name == "aten::cat" and e.input_shapes[0] == []]
        grads = {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}
        runs[shared] = loss, grads, len(casts)
    (loss0, grads0, casts0), (loss1, grads1, casts1) = runs[False], runs[True]
    assert torch.equal(loss0, loss1) and grads0.keys() == grads1.keys()
    assert all(torch.equal(grads1[name], ref) for name, ref in grads0.items())
    assert casts1 < casts0
