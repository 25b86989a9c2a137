"""float64 references of dormouse's Triton kernels, by torch and autograd, for the GPU tests (tests/gpu/)
and the interpreter's (tests/test_kernels_interpreted.py)."""

import torch
from conv_stand_in import StandInKernels


def conv(x, w, n, dilation, norm=0, head=0):
    """SiLU(causal depthwise conv) of x's first n·C channels, C at a time, the first `norm` L2-normalised
    per `head` channels (tests/conv_stand_in.py's): [n, B, T, C] float64."""
    return StandInKernels.conv(x.double(), w.double(), n, dilation, norm, head)


def conv_grads(x, w, dys, n, dilation, norm=0, head=0):
    """The gradients of x's first n·C channels and of w [n·C, W] for the output gradients `dys`."""
    xd, wd = x[..., : w.shape[0]].detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y = StandInKernels.conv(xd, wd, n, dilation, norm, head)
    return torch.autograd.grad(y, (xd, wd), torch.stack(dys).double())


def head_rstd(x, w, n, norm, head, eps):
    """The first `norm` of n convs' 1 / ‖SiLU output‖ per `head` channels (their L2 norm's scale, which the
    kernels keep for the backward): [norm, B, T, C / head] float64."""
    C = w.shape[0] // n
    silu = conv(x[..., : norm * C], w[: norm * C], norm, 1)
    return torch.rsqrt(silu.unflatten(-1, (-1, head)).square().sum(-1) + eps)


def gate_grads(h, vk, w_h, w_k, g, eps_h, eps_k):
    """The engram gate σ(⟨RMSNorm(k)·w_k, RMSNorm(h)·w_h⟩ / √d) · v of h and vk = [v | k]: (its output,
    the gradients of h, vk, w_h, w_k for g)."""
    h, vk, w_h, w_k = (x.detach().double().requires_grad_() for x in (h, vk, w_h, w_k))
    v, k = vk.chunk(2, dim=-1)

    def rms(x, w, eps):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    out = torch.sigmoid((rms(k, w_k, eps_k) * rms(h, w_h, eps_h)).sum(-1, keepdim=True) / h.shape[-1] ** 0.5) * v
    return out.detach(), torch.autograd.grad(out, [h, vk, w_h, w_k], g.double())
