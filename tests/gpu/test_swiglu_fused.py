"""dormouse's SwiGLU kernels (ops/swiglu/triton.py, through ops/swiglu/) against float64 on CUDA, and
against fla's SwiGLU kernels, bit for bit; skipped without CUDA/Triton.

The kernels compute `silu(gate) * up` and both gradients in fp32 from the inputs and round once to the
inputs' dtype: against the float64 function of the same (rounded) inputs, max|d|/max|ref| within 1e-6 in
fp32 and within one bf16 rounding (2^-8) in bf16, for the output and the packed gradient [..., 2H]; in
bf16 no worse than torch's plain path, which rounds the SiLU first. Also: a model on CUDA runs every
SwiGLU fused, and the fused step's loss and gradients match the plain step's.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
from dormouse.ops.swiglu import fused as swiglu  # noqa: E402
from dormouse.ops.swiglu import reference as swiglu_reference  # noqa: E402

if swiglu.fused_kernels()[0] is None:
    pytest.skip(f"needs Triton (extra `gpu`): {swiglu.fused_kernels()[1]}", allow_module_level=True)

from dormouse import counters, rng  # noqa: E402
from dormouse.model.model import DormouseLM  # noqa: E402

# fla through dormouse, never directly: fla reads the kernel pin's variables once, at its import.
from dormouse.ops.fla import kernels as fla_kernels  # noqa: E402
from gpu.models import nano_on_cuda  # noqa: E402 (tests/gpu/models.py)

TOL = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8}


def rel(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max()).item()


def reference(h: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, d h) in float64 from the same inputs, by autograd of the formula."""
    h = h.double().requires_grad_()
    gate, up = h.chunk(2, dim=-1)
    out = gate * torch.sigmoid(gate) * up
    (dh,) = torch.autograd.grad(out, h, g.double())
    return out.detach(), dh


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(64, 512, 3072), (3, 5, 192)], ids=["small-b64", "ragged"])
def test_fused_packed_against_float64(dtype, shape):
    gen = rng.generator(0, 0, "test")
    h = (2 * torch.randn(*shape, generator=gen)).to(dtype).cuda().requires_grad_()
    # a non-contiguous incoming gradient: the kernel reads it through its row stride
    g = torch.randn(*shape[:-1], shape[-1], generator=gen).to(dtype).cuda()[..., : shape[-1] // 2]
    out = swiglu.fused_packed(h)
    (dh,) = torch.autograd.grad(out, h, g)
    ref_out, ref_dh = reference(h.detach(), g)
    assert out.dtype == dh.dtype == dtype and dh.is_contiguous()
    assert rel(out, ref_out) <= TOL[dtype]
    assert rel(dh, ref_dh) <= TOL[dtype]
    if dtype == torch.bfloat16:  # torch's path, the SiLU rounded to bf16 before the product
        hp = h.detach().clone().requires_grad_()
        plain = swiglu_reference.swiglu(*hp.chunk(2, dim=-1))
        (dh_plain,) = torch.autograd.grad(plain, hp, g)
        assert rel(out, ref_out) <= rel(plain, ref_out) and rel(dh, ref_dh) <= rel(dh_plain, ref_dh)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(64, 512, 3072), (3, 5, 192)], ids=["small-b64", "ragged"])
def test_the_kernels_give_fla_s_bits(dtype, shape):
    # fla's SwiGLU kernels do the same arithmetic, term for term.
    ops, why = fla_kernels.swiglu()
    if ops is None:
        pytest.skip(f"needs fla-core: {why}")
    gen = rng.generator(0, 2, "test")
    h = (2 * torch.randn(*shape, generator=gen)).to(dtype).cuda()
    g = torch.randn(*shape[:-1], shape[-1] // 2, generator=gen).to(dtype).cuda()
    gate, up = (half.reshape(-1, shape[-1] // 2) for half in h.chunk(2, dim=-1))
    n, d = gate.numel(), gate.shape[-1]
    z = torch.empty(gate.shape, dtype=dtype, device="cuda")
    ops.swiglu_fwd_kernel[lambda meta: (-(-n // meta["B"]),)](
        x=gate, y=up, z=z, stride_x_row=gate.stride(0), stride_y_row=up.stride(0), stride_z_row=d, T=n, D=d
    )
    dh = torch.empty_like(h)
    d_gate, d_up = (half.reshape(-1, d) for half in dh.chunk(2, dim=-1))
    ops.swiglu_fwdbwd_kernel[lambda meta: (-(-n // meta["B"]),)](
        x=gate, y=up, g=g.reshape(-1, d), dx=d_gate, dy=d_up, z=None, stride_x_row=gate.stride(0),
        stride_y_row=up.stride(0), stride_g_row=d, stride_dx_row=2 * d, stride_dy_row=2 * d, stride_z_row=0, T=n, D=d,
    )  # fmt: skip
    hg = h.clone().requires_grad_()
    out = swiglu.fused_packed(hg)
    (dh_own,) = torch.autograd.grad(out, hg, g)
    assert torch.equal(out.reshape(-1, d), z) and torch.equal(dh_own, dh)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_pair_equals_the_packed_forward(dtype):
    gen = rng.generator(0, 1, "test")
    h = torch.randn(4, 33, 2 * 160, generator=gen).to(dtype).cuda()
    with torch.no_grad():
        packed = swiglu.fused_packed(h)
        pair = swiglu.fused_pair(*(half.contiguous() for half in h.chunk(2, dim=-1)))
    assert torch.equal(packed, pair)


def test_model_on_cuda_runs_every_swiglu_fused_and_matches_plain():
    cfg = nano_on_cuda()
    assert cfg.model.swiglu_backend == "fused"
    ids = torch.randint(0, 256, (2, 64), generator=rng.generator(0, 0, "test")).cuda()
    results = {}
    for backend in ("fused", "plain"):
        cfg.model.swiglu_backend = backend
        model = DormouseLM(cfg.model, seed=0).cuda()
        counters.SWIGLU.reset()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, targets=ids).loss
        loss.backward()
        expect = cfg.model.block_layers * cfg.model.depth
        assert (counters.SWIGLU.fused, counters.SWIGLU.calls) == ((expect if backend == "fused" else 0), expect)
        dense = [p.grad.flatten() for p in model.parameters() if p.grad is not None and not p.grad.is_sparse]
        results[backend] = (loss.item(), torch.cat(dense))
    (loss_f, grad_f), (loss_p, grad_p) = results["fused"], results["plain"]
    assert abs(loss_f - loss_p) <= 1e-3 * abs(loss_p)
    assert rel(grad_f, grad_p.double()) <= 2e-2
