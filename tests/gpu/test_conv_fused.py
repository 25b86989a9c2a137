"""The fused short conv (fla's Triton causal_conv1d, SiLU in the kernel) against the plain torch path on
CUDA; skipped without CUDA/fla.

Both accumulate the 4 taps in fp32. fp32 inputs: output and gradients (input, weight) agree to 1e-5
relative (max|d|/max|ref|); bf16 inputs: the output to two bf16 roundings (2^-7: the SiLU rounds once
more on torch's path) and the gradients to 1e-2, which pass through bf16 tensors. Also: the fused
path's tail equals the plain one, and a `small`-width model on CUDA runs every conv fused.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
# fla through dormouse, never directly: fla reads the kernel pin's variables once, at its import, and a
# direct import before them left every kernel to Triton's timing (minutes of autotuning, other kernels).
from dormouse.model import fla_kernels  # noqa: E402

if fla_kernels.causal_conv1d()[0] is None:
    pytest.skip(f"needs fla-core (extra `gpu`): {fla_kernels.causal_conv1d()[1]}", allow_module_level=True)

from dormouse import counters, rng  # noqa: E402
from dormouse.config import build, resolve  # noqa: E402
from dormouse.model.model import DormouseLM  # noqa: E402
from dormouse.model.short_conv import ShortConv  # noqa: E402

TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2.0**-7, 1e-2)}  # (output, gradients)


def rel(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def run(backend, x, w, dy):
    conv = ShortConv(x.shape[-1], w.shape[-1]).cuda()
    conv.backend = backend
    with torch.no_grad():
        conv.weight.copy_(w)
    x = x.detach().clone().requires_grad_()
    y, tail = conv(x, None)
    y.backward(dy)
    return y.detach(), tail.detach(), x.grad, conv.weight.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(64, 256, 512), (3, 2, 96)], ids=["candidate", "shorter-than-kernel"])
def test_fused_equals_plain(dtype, shape):
    gen = rng.generator(0, 0, "test")
    x = torch.randn(*shape, generator=gen).to(dtype).cuda()
    w = (0.5 * torch.randn(shape[-1], 1, 4, generator=gen)).cuda()
    dy = torch.randn(*shape, generator=gen).to(dtype).cuda()
    counters.CONV.reset()
    fused = run("fused", x, w, dy)
    plain = run("plain", x, w, dy)
    assert (counters.CONV.fused, counters.CONV.calls) == (1, 2)
    assert fused[0].dtype == plain[0].dtype == dtype
    assert torch.equal(fused[1], plain[1]), "tail"
    out_tol, grad_tol = TOL[dtype]
    assert rel(fused[0], plain[0]) <= out_tol
    assert rel(fused[2], plain[2]) <= grad_tol, "d input"
    assert rel(fused[3], plain[3]) <= grad_tol, "d weight"


def test_model_on_cuda_runs_every_conv_fused():
    cfg = resolve(build("nano"), cuda_available=True)
    assert cfg.model.conv_backend == "fused"
    model = DormouseLM(cfg.model, seed=0).cuda()
    ids = torch.randint(0, 256, (2, 64), generator=rng.generator(0, 0, "test")).cuda()
    counters.CONV.reset()
    model(ids, targets=ids).loss.backward()
    assert counters.CONV.calls == 3 * cfg.model.block_layers * cfg.model.depth == counters.CONV.fused
