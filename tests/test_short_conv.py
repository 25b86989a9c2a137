"""The KDA layer's short conv on the CPU: the plain path against a float64 loop, its carried state, the
backend policy (fused refused here, loudly), and the fused path's wiring (one conv, and q, k, v as slices
of one projection with one gradient) with a torch stand-in for dormouse's Triton kernels.

The kernels' own numbers (against float64, output and gradients) are tests/gpu/test_conv_fused.py.
"""

import pytest
import torch
from backend_stand_in import force
from conv_stand_in import StandInKernels  # tests/conv_stand_in.py

from dormouse import config, counters, ledger, rng
from dormouse.model.engram import EngramConv
from dormouse.model.model import DormouseLM
from dormouse.model.short_conv import ShortConv, set_conv_backend
from dormouse.ops import short_conv
from dormouse.ops.norm.reference import l2norm
from dormouse.ops.short_conv import fused as conv_fused
from dormouse.resolve import resolve


def convolve(h, convs, rest, norm=0, head=0, sinks=False):
    """`short_conv.convolve_packed` of the ShortConvs `convs` (their weights, their backend) as one tuple:
    the outputs, the first `norm` L2-normalised over heads (here, by torch, where the op left them), the
    rest, the sinks."""
    c = short_conv.convolve_packed(h, tuple(c.weight for c in convs), convs[0].backend, rest, norm, head, sinks)
    outs = list(c.outs)
    for i in range(0 if c.normed else norm):
        outs[i] = l2norm(outs[i].unflatten(-1, (-1, head))).flatten(-2).to(outs[i].dtype)
    return (*outs, *(c.sinks or ()))


def loop_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SiLU(y), y[b, t, c] = sum_j weight[c, j] · x[b, t - (W - 1) + j], zeros before the start: float64 loops."""
    B, T, C = x.shape
    W = weight.shape[1]
    y = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for c in range(C):
                for j in range(W):
                    s = t - (W - 1) + j
                    if s >= 0:
                        y[b, t, c] += weight[c, j].double() * x[b, s, c].double()
    return y * torch.sigmoid(y)


def make_conv(channels=3, size=4, seed=0) -> ShortConv:
    conv = ShortConv(channels, size)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=torch.Generator().manual_seed(seed)))
    return conv


def test_plain_matches_the_loop_and_returns_the_last_inputs():
    conv = make_conv()
    x = torch.randn(2, 7, 3, generator=torch.Generator().manual_seed(1))
    y, tail = conv(x, None)
    assert torch.allclose(y.double(), loop_reference(x, conv.weight[:, 0]), rtol=0, atol=1e-6)
    assert torch.equal(tail, x[:, -3:])


def test_carried_state_continues_the_sequence():
    conv = make_conv()
    x = torch.randn(2, 9, 3, generator=torch.Generator().manual_seed(2))
    whole, _ = conv(x, None)
    first, tail = conv(x[:, :5], None)
    rest, _ = conv(x[:, 5:], tail)
    assert torch.allclose(torch.cat([first, rest], 1), whole, rtol=0, atol=1e-6)
    short, short_tail = conv(x[:, :2], None)  # shorter than the kernel: the tail starts with zeros
    assert torch.equal(short_tail, torch.cat([torch.zeros(2, 1, 3), x[:, :2]], 1))


def test_packed_plain_matches_the_loop_and_passes_gradcheck():
    # The plain path of `convolve_packed` runs the slices as one channels-last conv: each slice's output
    # is its own conv's (the float64 loop), and its gradients are the function's (central differences).
    gen = torch.Generator().manual_seed(5)
    B, T, C = 2, 6, 3
    h = torch.randn(B, T, 3 * C + 2, dtype=torch.float64, generator=gen, requires_grad=True)
    weights = tuple(torch.randn(C, 1, 4, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    *outs, rest = short_conv.convolve_packed(h, weights, "plain", (2,)).outs
    for i, (out, w) in enumerate(zip(outs, weights, strict=True)):
        assert torch.allclose(
            out, loop_reference(h[..., i * C : (i + 1) * C].detach(), w[:, 0].detach()), rtol=0, atol=1e-12
        )
    assert torch.equal(rest, h[..., 3 * C :])
    assert torch.autograd.gradcheck(lambda h, *w: short_conv.convolve_packed(h, w, "plain", (2,)).outs, (h, *weights))


def test_fused_on_cpu_is_refused_through_the_ledger():
    assert ledger.SITES["conv.fused_unavailable"].kind is ledger.Kind.LOUD
    conv = make_conv()
    conv.backend = "fused"
    with pytest.raises(ledger.FallbackRefused, match="--conv-backend plain") as err:
        conv(torch.ones(1, 5, 3), None)
    assert err.value.site == "conv.fused_unavailable"


@pytest.fixture
def fused(monkeypatch):
    """The fused path chosen on the CPU, its kernels the stand-in."""
    StandInKernels.calls = []
    monkeypatch.setattr(conv_fused, "fused_kernels", lambda: (StandInKernels, ""))
    force(monkeypatch, {"conv": None})
    return StandInKernels.calls


def test_the_fused_path_hands_the_kernels_its_layout_and_keeps_the_tail(fused):
    conv, plain_conv = make_conv().double(), make_conv().double()
    conv.backend, plain_conv.backend = "fused", "plain"
    x = torch.randn(2, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    counters.CONV.reset()
    (y, y_tail), (ref, ref_tail) = conv(x, None), plain_conv(x, None)
    assert fused == [("forward", (2, 6, 3), 1, (3, 4), 1, 0, 0)]  # [B, T, C] and the weight as [C, W]
    assert torch.allclose(y, ref, rtol=0, atol=1e-12) and torch.equal(y_tail, ref_tail)
    assert (counters.CONV.fused, counters.CONV.calls) == (1, 2)


@pytest.mark.parametrize("norm", [0, 2])
def test_packed_convs_fused_equal_the_split_and_write_one_gradient(fused, norm):
    # q, k, v as slices of one projection [B, T, 3C + 2]: the fused Function's outputs (the first `norm`
    # L2-normalised over heads of 2 channels), the rest, and the gradients of the projection and of the
    # three weights equal the plain path's (split, conv each, then torch's l2norm); one kernel call each way.
    gen = torch.Generator().manual_seed(4)
    B, T, C, head = 2, 7, 4, 2
    h0 = torch.randn(B, T, 3 * C + 2, dtype=torch.float64, generator=gen)
    dys = [torch.randn(B, T, C, dtype=torch.float64, generator=gen) for _ in range(3)]
    drest = torch.randn(B, T, 2, dtype=torch.float64, generator=gen)
    results = []
    for backend in ("fused", "plain"):
        convs = tuple(make_conv(C, seed=s).double() for s in range(3))
        set_conv_backend(torch.nn.ModuleList(convs), backend)
        h = h0.clone().requires_grad_()
        counters.CONV.reset()
        *outs, rest = convolve(h, convs, (2,), norm=norm, head=head)
        assert rest.data_ptr() == h.data_ptr() + 3 * C * h.element_size()  # a view, not a copy
        assert (counters.CONV.fused, counters.CONV.calls) == ((3 if backend == "fused" else 0), 3)
        sum((o * dy).sum() for o, dy in zip(outs, dys, strict=True)).add((rest * drest).sum()).backward()
        results.append((*outs, rest, h.grad, *(c.weight.grad for c in convs)))
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    # one forward and one backward over the three slices; the backward wrote one [B, T, 3C + 2] gradient
    assert [c[0] for c in fused] == ["forward", "backward"]
    assert fused[1] == ("backward", (B, T, 3 * C + 2), (T * (3 * C + 2), 3 * C + 2, 1), 3, norm, head)


def test_gradients_given_to_the_sinks_reach_the_kernels_in_fp32_unrounded(fused):
    # bf16 q, k, v with two sinks: fp32, zero, zero-stride, shaped as q and k. q's gradient comes only
    # through its sink, k's through both (summed), v's as its own: the kernels get q's and k's in fp32 as
    # given (not rounded to bf16), v's in bf16, and the rest's gradient lands in the projection's.
    gen = torch.Generator().manual_seed(5)
    B, T, C = 2, 7, 4
    h = torch.randn(B, T, 3 * C + 2, generator=gen).bfloat16().requires_grad_()
    convs = tuple(make_conv(C, seed=s) for s in range(3))
    set_conv_backend(torch.nn.ModuleList(convs), "fused")
    q, k, v, rest, q_sink, k_sink = convolve(h, convs, (2,), norm=2, head=2, sinks=True)
    assert q_sink.dtype == k_sink.dtype == torch.float32 and q_sink.shape == q.shape and q_sink.stride() == (0, 0, 0)
    assert not q_sink.any()
    dq, dk, dk_own = (torch.randn(B, T, C, generator=gen) for _ in range(3))
    dv, drest = torch.randn(B, T, C, generator=gen).bfloat16(), torch.randn(B, T, 2, generator=gen).bfloat16()
    loss = (q_sink * dq).sum() + (k_sink * dk).sum() + (k * dk_own.bfloat16()).sum() + (v * dv).sum()
    (loss + (rest * drest).sum()).backward()
    got_q, got_k, got_v = StandInKernels.last_dys
    assert got_q.dtype == got_k.dtype == torch.float32 and got_v.dtype == torch.bfloat16
    assert torch.equal(got_q, dq) and torch.equal(got_k, dk + dk_own.bfloat16()) and torch.equal(got_v, dv)
    assert torch.equal(h.grad[..., 3 * C :], drest)
    set_conv_backend(torch.nn.ModuleList(convs), "plain")  # sinks come with the fused kernels only
    weights = tuple(c.weight for c in convs)
    assert short_conv.convolve_packed(h, weights, "plain", (2,), norm=2, head=2, sinks=True).sinks is None


def test_a_conv_wider_than_the_kernels_is_refused_on_the_fused_path(fused):
    wide = make_conv(size=5)
    wide.backend = "fused"
    with pytest.raises(ledger.FallbackRefused, match="conv_size <= 4") as err:
        wide(torch.ones(1, 6, 3), None)
    assert err.value.site == "conv.fused_unavailable"
    wide.backend = "plain"
    assert wide(torch.ones(1, 6, 3), None)[0].shape == (1, 6, 3)
    assert not short_conv.is_fused("plain", torch.device("cpu"), 8)  # nothing to refuse


def test_a_decode_step_runs_plain_and_is_counted(fused):
    conv = make_conv()
    conv.backend = "fused"
    counters.CONV.reset()
    conv(torch.ones(1, 1, 3), torch.zeros(1, 3, 3))  # a carried state: torch's conv, whatever the backend
    assert (counters.CONV.fused, counters.CONV.calls) == (0, 1)


def test_config_resolves_and_the_model_sets_every_conv():
    cfg = resolve(config.build("nano", {"model": {"engram": True, "dropout": 0.0}}), cuda_available=False)
    assert cfg.model.conv_backend == "plain"
    model = DormouseLM(cfg.model, seed=0)
    convs = [m for m in model.modules() if isinstance(m, ShortConv)]
    engram_convs = [m for m in model.modules() if isinstance(m, EngramConv)]
    assert len(convs) == 3 * cfg.model.block_layers and len(engram_convs) == 1
    assert {m.backend for m in convs + engram_convs} == {"plain"}
    set_conv_backend(model, "fused")
    assert {m.backend for m in convs + engram_convs} == {"fused"}
    set_conv_backend(model, "auto")
    counters.CONV.reset()
    model(torch.zeros(1, 8, dtype=torch.long))
    # every conv of every loop iteration ran, and the engram's once, none fused
    assert (counters.CONV.fused, counters.CONV.calls) == (0, 3 * cfg.model.block_layers * cfg.model.depth + 1)


def test_the_engram_conv_runs_the_fused_path_from_the_sequence_start(fused):
    # EngramConv (kernel 4, dilation 4) through the kernels' contract: its output, the input's and every
    # parameter's gradients equal the plain path's in float64; a call with a carried tail (decode) runs
    # plain; both are counted.
    gen = rng.generator(0, 0, "test")
    v0 = torch.randn(2, 19, 6, dtype=torch.float64, generator=gen)
    dy = torch.randn(2, 19, 6, dtype=torch.float64, generator=gen)
    results = []
    for backend in ("fused", "plain"):
        conv = EngramConv(6, 4, 4, 1e-6).double()
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=rng.generator(0, 1, "test")))
            conv.norm.weight.copy_(1 + 0.1 * torch.randn(6, generator=rng.generator(0, 2, "test")))
        conv.backend = backend
        v = v0.clone().requires_grad_()
        counters.CONV.reset()
        y, tail = conv(v, None)
        assert (counters.CONV.fused, counters.CONV.calls) == (int(backend == "fused"), 1)
        y.backward(dy)
        results.append((y, tail, v.grad, conv.weight.grad, conv.norm.weight.grad))
    for name, got, ref in zip(("y", "tail", "dv", "dw", "dnorm"), *results, strict=True):
        assert got.shape == ref.shape and torch.allclose(got, ref, rtol=1e-12, atol=1e-12), name
    assert [c[0] for c in fused] == ["forward", "backward"]
    conv.backend = "fused"
    counters.CONV.reset()
    conv(v0[:, :1], tail)
    assert (counters.CONV.fused, counters.CONV.calls) == (0, 1)
