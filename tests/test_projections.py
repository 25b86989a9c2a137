"""project(): several bias-free Linears reading one input as one matmul."""

import torch
from torch.profiler import ProfilerActivity, profile

from dormouse import rng
from dormouse.model.init import linear, normal_init_
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
