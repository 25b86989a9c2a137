"""project(): several bias-free Linears reading one input as one matmul."""

from contextlib import nullcontext

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from dormouse import rng
from dormouse.model import model as model_module
from dormouse.model import projections
from dormouse.model.init import linear, normal_init_
from dormouse.model.model import DormouseLM
from dormouse.model.projections import project


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


def test_bf16_affine_adds_the_bias_in_the_matmul_and_sums_its_gradient_in_fp32(monkeypatch):
    # The CUDA bf16 path (_Bf16Linear with a bias) on the CPU: the fp32-output matmul, which torch has
    # only on CUDA, stood in by an fp64 product rounded to fp32. Input: a column slice of a wider tensor,
    # as the KDA layer's g_b reads its low-rank half. The output is the fp64 result within one bf16
    # rounding (the bias added before rounding); the bias's gradient is the fp64 column sum of the
    # (bf16) output gradient to fp32 rounding.
    monkeypatch.setattr(projections, "bf16_matmul", lambda x: True)
    monkeypatch.setattr(projections, "_mm_fp32", lambda a, b: (a.double() @ b.double()).float())
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


def _bf16_path_on_cpu(monkeypatch):
    """The CUDA bf16 path on the CPU: its fp32-output matmuls stood in by fp64 products rounded to fp32."""
    monkeypatch.setattr(projections, "bf16_matmul", lambda x: True)
    monkeypatch.setattr(projections, "_mm_fp32", lambda a, b: (a.double() @ b.double()).float())
    addmm = lambda c, a, b: torch.addmm(c.double(), a.double(), b.double()).float()  # noqa: E731
    monkeypatch.setattr(projections, "_addmm_fp32", addmm)


def _twice(lin, x, dy, shared: bool):
    """lin applied twice in a row (as the looped block applies a layer) and the backward of dy, with the
    applications sharing their cast or not: (the output, the profiler's events)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        if shared:
            with projections.shared_casts():
                y = projections.affine_of(projections.affine_of(x, lin), lin)
        else:
            y = projections.affine_of(projections.affine_of(x, lin), lin)
        y.backward(dy)
    return y, prof.events()


def test_shared_casts_cast_a_group_once_and_sum_its_gradients_in_the_matmul(monkeypatch):
    # Two applications of one Linear with a bias: shared, one cast of the weight (not two) and no add of
    # two weight or bias gradients; the gradients are the fp64 sums of both applications' products to
    # fp32 rounding, as the unshared path's (which adds two fp32-rounded products).
    _bf16_path_on_cpu(monkeypatch)
    gen = rng.generator(0, 0, "test")
    lin = torch.nn.Linear(24, 24)
    normal_init_(lin.weight, gen)
    torch.nn.init.normal_(lin.bias, std=1.0, generator=gen)
    x = torch.randn(3, 40, 24, generator=rng.generator(0, 1, "test")).bfloat16()
    dy = torch.randn(3, 40, 24, generator=rng.generator(0, 2, "test")).bfloat16()
    w, b = lin.weight.bfloat16().double(), lin.bias.bfloat16().double()
    h = (x.double() @ w.T + b).bfloat16().double()  # the first application's output, in bf16
    dh = (dy.double() @ w).bfloat16().double()  # its gradient, in bf16
    dw_exact = torch.einsum("bto,bti->oi", dy.double(), h) + torch.einsum("bto,bti->oi", dh, x.double())
    db_exact = dy.double().sum((0, 1)) + dh.sum((0, 1))
    grads = {}
    for shared in (False, True):
        lin.weight.grad = lin.bias.grad = None
        y, events = _twice(lin, x, dy, shared)
        grads[shared] = lin.weight.grad, lin.bias.grad
        casts = [e for e in events if e.name == "aten::cat" and e.input_shapes[0] == []]  # [W] as a list
        adds = [e for e in events if e.name in ("aten::add", "aten::add_") and [24, 24] in e.input_shapes]
        assert (len(casts), len(adds)) == ((1, 0) if shared else (2, 1))
        assert torch.allclose(y.double(), (h @ w.T + b), rtol=2.0**-8, atol=0)
        assert torch.allclose(lin.weight.grad.double(), dw_exact, rtol=1e-6, atol=1e-5)
        assert torch.allclose(lin.bias.grad.double(), db_exact, rtol=1e-6, atol=1e-5)
    assert not torch.equal(grads[True][0], grads[False][0])  # the sum rounded once, not twice


def test_a_shared_group_whose_application_has_no_backward_raises_at_the_end_of_the_pass(monkeypatch):
    _bf16_path_on_cpu(monkeypatch)
    lin = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(2, 5, 8, generator=rng.generator(0, 1, "test")).bfloat16()
    with projections.shared_casts():
        projections.linear_of(x, lin)  # its output never reaches the loss
        y = projections.linear_of(x, lin)
    with pytest.raises(RuntimeError, match="gradient would be lost"):
        y.float().sum().backward()


def test_applications_without_autograd_do_not_join_a_share(monkeypatch):
    # An iteration outside --rand-depth-bptt's window runs without gradients: it must not count as an
    # application whose backward the others wait for.
    _bf16_path_on_cpu(monkeypatch)
    lin = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(2, 5, 8, generator=rng.generator(0, 1, "test")).bfloat16()
    with projections.shared_casts():
        with torch.no_grad():
            h = projections.linear_of(x, lin)
        y = projections.linear_of(h, lin)
    y.float().sum().backward()
    assert torch.allclose(lin.weight.grad.double(), torch.ones(10, 8).double().T @ h.double().reshape(10, 8))


def test_the_looped_blocks_weight_gradients_with_shared_casts_are_the_unshared_ones_to_fp32_rounding(monkeypatch):
    # A depth-2 model on the bf16 path (CPU stand-ins): the loop shares each layer's cast between its two
    # applications. Every gradient matches the model without sharing to fp32 rounding (a lost
    # application's gradient would be off by its whole size), and the block's weights show the one rounding.
    from test_model import ids, tiny

    _bf16_path_on_cpu(monkeypatch)
    model = DormouseLM(tiny(depth=2))
    x, y = ids(2, 24), ids(2, 24, step=1)
    grads = {}
    for shared in (False, True):
        monkeypatch.setattr(model_module, "shared_casts", projections.shared_casts if shared else nullcontext)
        model.zero_grad(set_to_none=True)
        model(x, y).loss.backward()
        grads[shared] = {n: p.grad.to_dense() for n, p in model.named_parameters() if p.grad is not None}
    assert grads[True].keys() == grads[False].keys()
    for name, ref in grads[False].items():
        assert torch.allclose(grads[True][name], ref, rtol=1e-5, atol=1e-6 * ref.abs().max()), name
    assert not torch.equal(grads[True]["layers.0.ffn.w_down.weight"], grads[False]["layers.0.ffn.w_down.weight"])
