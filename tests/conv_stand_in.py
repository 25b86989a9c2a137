"""A float64 torch stand-in for ops/short_conv/triton.py (which needs Triton and CUDA), shared by the
CPU tests of the fused conv path (tests/test_short_conv.py, tests/test_kda.py)."""

import torch
import torch.nn.functional as F

from dormouse.ops.norm.reference import l2norm


class StandInKernels:
    """ops/short_conv/triton.py's contract in torch, float64 inside: `forward` returns SiLU(conv i(x))
    for each of n convs over adjacent channel slices, [n, B, T, C], the first `norm` L2-normalised per
    head; `backward` writes the input's gradient into dx's first n·C channels and returns the weight's."""

    calls = []
    last_dys = ()  # the output gradients the last backward was given

    @staticmethod
    def conv(x, weight, n, dilation, norm, head):
        C, W = weight.shape[0] // n, weight.shape[1]
        outs = []
        for i in range(n):
            xi = F.pad(x[..., i * C : (i + 1) * C].transpose(1, 2), ((W - 1) * dilation, 0))
            a = F.conv1d(xi, weight[i * C : (i + 1) * C, None], groups=C, dilation=dilation)
            y = F.silu(a).transpose(1, 2)
            outs.append(l2norm(y.unflatten(-1, (-1, head))).flatten(-2) if i < norm else y)
        return torch.stack(outs)

    @classmethod
    def forward(cls, x, weight, n=1, dilation=1, norm=0, head=0):
        cls.calls.append(("forward", tuple(x.shape), x.stride(-1), tuple(weight.shape), n, norm, head))
        y = cls.conv(x.double(), weight.double(), n, dilation, norm, head).to(x.dtype)
        rstd = torch.full((norm, *x.shape[:2], weight.shape[0] // n // max(head, 1)), float("nan")) if norm else None
        return y, rstd  # the stand-in's backward recomputes the norm: a NaN rstd must not reach it

    @classmethod
    def backward(cls, x, weight, dys, dx, dilation=1, norm=0, head=0, rstd=None):
        cls.calls.append(("backward", tuple(x.shape), tuple(dx.stride()), len(dys), norm, head))
        cls.last_dys = dys
        assert (rstd is not None) == bool(norm) and (rstd is None or rstd.shape[0] == norm)
        n, C = len(dys), weight.shape[0] // len(dys)
        with torch.enable_grad():  # a backward runs without grad mode
            xd = x[..., : n * C].detach().double().requires_grad_()
            wd = weight.detach().double().requires_grad_()
            y = cls.conv(xd, wd, n, dilation, norm, head)
            gx, gw = torch.autograd.grad(y, (xd, wd), torch.stack(dys).double())
        dx[..., : n * C].copy_(gx)
        return gw.to(weight.dtype)
