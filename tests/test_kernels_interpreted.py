"""dormouse's Triton kernels on the CPU, under Triton's interpreter (tests/triton_interpreter.py), against
float64: the kernels' indexing, masks, strides, loops and fp32 arithmetic checked in every CI run, where
the GPU tests (tests/gpu/) run only on a CUDA machine. Small shapes, ragged against the blocks; the
optimizers' and the tables' kernels through their callers' CUDA code paths; and a nano model's step with
every dormouse kernel it has against its torch paths.

What the interpreter cannot check stays with the GPU tests: bf16 rounding to nearest (the interpreter
truncates, so bf16 outputs are held to 2^-7 here, 2^-8 on the GPU), the GPU's summation orders, the
compiled code and its speed. Skipped where CUDA is (the GPU tests run there) or Triton is not installed.
"""

import dataclasses

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the kernels run compiled here: tests/gpu/", allow_module_level=True)
pytest.importorskip("triton", reason="Triton (the dev extra) runs the kernels' interpreter")
import triton_interpreter  # noqa: E402

triton_interpreter.fix()

from float64_references import conv, conv_grads, gate_grads, head_rstd  # noqa: E402

from dormouse import counters, rng  # noqa: E402
from dormouse.config import build  # noqa: E402
from dormouse.model.model import DormouseLM  # noqa: E402
from dormouse.ops import registry, sinkhorn  # noqa: E402
from dormouse.ops.engram_gate import fused as engram_gate  # noqa: E402
from dormouse.ops.engram_gate import triton as gate_kernels  # noqa: E402
from dormouse.ops.norm import triton as norm_kernels  # noqa: E402
from dormouse.ops.row_sum import triton as row_sum_kernels  # noqa: E402
from dormouse.ops.short_conv import fused as short_conv  # noqa: E402
from dormouse.ops.short_conv import triton as short_conv_kernels  # noqa: E402
from dormouse.ops.sinkhorn import reference as sinkhorn_reference  # noqa: E402
from dormouse.ops.sinkhorn import triton as sinkhorn_kernels  # noqa: E402
from dormouse.ops.swiglu import triton as swiglu_kernels  # noqa: E402
from dormouse.resolve import resolve  # noqa: E402
from dormouse.train import optim  # noqa: E402
from dormouse.train.sparse import RowPlan, SparseRowAdam  # noqa: E402

# max|d| / max|ref|: fp32 arithmetic; a bf16 store truncated by the interpreter (< 2^-7 relative)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7}


def rel(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def randn(*shape, seed=0, dtype=torch.float32, scale=1.0):
    return (scale * torch.randn(*shape, generator=rng.generator(0, seed, "test"))).to(dtype)


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """The optimizers' and the tables' kernel paths (`registry.on_kernel_device`) on CPU tensors."""
    monkeypatch.setattr(registry, "on_kernel_device", lambda t: True)


# ---- the short conv (ops/short_conv/triton.py)


@pytest.mark.parametrize(
    ("dtype", "width", "dilation"),
    [(torch.float32, 4, 1), (torch.bfloat16, 4, 4), (torch.float32, 3, 4), (torch.bfloat16, 2, 1)],
    ids=["fp32-w4", "bf16-w4-dil4", "fp32-w3-dil4", "bf16-w2"],
)
def test_conv_kernels_against_float64(dtype, width, dilation):
    # A slice of a wider tensor (as q, k, v of the projection), 37 positions (not a multiple of the blocks').
    B, T, C = 2, 37, 48
    x = randn(B, T, 3 * C + 8, seed=1, dtype=dtype)[..., C : 2 * C]
    w, dy = randn(C, width, seed=2, scale=0.5), randn(B, T, C, seed=3, dtype=dtype)
    blocks = (8, 32, 1, 1)  # several position and channel blocks at this size
    y = short_conv_kernels.forward(x, w, dilation=dilation, blocks=blocks)[0][0]
    dx = torch.empty_like(dy)
    dw = short_conv_kernels.backward(x, w, (dy,), dx, dilation, blocks=blocks)
    y_ref, (dx_ref, dw_ref) = conv(x, w, 1, dilation), conv_grads(x, w, (dy,), 1, dilation)
    assert y.dtype == dx.dtype == dtype and dw.dtype == torch.float32 and dw.shape == (C, width)
    assert rel(y, y_ref[0]) <= TOL[dtype] and rel(dx, dx_ref) <= TOL[dtype] and rel(dw, dw_ref) <= 1e-5
    dx_again = torch.empty_like(dy)
    assert torch.equal(short_conv_kernels.backward(x, w, (dy,), dx_again, dilation, blocks=blocks), dw)
    assert torch.equal(dx_again, dx)


def test_packed_conv_normalising_q_and_k_with_fp32_and_bf16_gradients():
    # q, k, v in one launch each way, q and k L2-normalised per head of 16; q's and k's gradients fp32 (fla's,
    # through the sinks), v's bf16: two launches of the backward (one per dtype), one result. 5 channels
    # after the three are untouched.
    B, T, C, head = 2, 21, 32, 16
    wide = randn(B, T, 3 * C + 5, seed=4, dtype=torch.bfloat16)
    w = randn(3 * C, 4, seed=5, scale=0.5)
    dys = (randn(B, T, C, seed=6), randn(B, T, C, seed=7), randn(B, T, C, seed=8, dtype=torch.bfloat16))
    y, rstd = short_conv_kernels.forward(wide, w, 3, 1, 2, head, blocks=(8, 32, 1, 1))
    dx = torch.zeros_like(wide)
    dw = short_conv_kernels.backward(wide, w, dys, dx, 1, 2, head, rstd, blocks=(8, 32, 1, 1))
    y_ref = conv(wide[..., : 3 * C], w, 3, 1, 2, head)
    dx_ref, dw_ref = conv_grads(wide[..., : 3 * C], w, dys, 3, 1, 2, head)
    rstd_ref = head_rstd(wide, w, 3, 2, head, short_conv_kernels.NORM_EPS)
    assert rel(y, y_ref) <= TOL[torch.bfloat16] and rel(rstd, rstd_ref) <= 1e-5
    assert rel(dx[..., : 3 * C], dx_ref) <= TOL[torch.bfloat16] and rel(dw, dw_ref) <= 1e-5
    assert not dx[..., 3 * C :].any()


def test_fused_convs_function_adds_the_sinks_and_writes_the_rest(monkeypatch):
    # The autograd Function around the kernels (ops/short_conv/fused.py `fused_convs`): q's and k's gradients handed to
    # their fp32 sinks, v's to its output; the 6 channels after them pass through as views, their
    # gradient copied into the one input gradient; the weights' gradients split per conv.
    B, T, C, head = 2, 13, 32, 16
    packed = randn(B, T, 3 * C + 6, seed=9).requires_grad_()
    weights = [randn(C, 4, seed=10 + i, scale=0.5).requires_grad_() for i in range(3)]
    q, k, v, rest, sink_q, sink_k = short_conv.fused_convs(packed, tuple(weights), 1, (6,), 2, head, 2)
    assert sink_q.dtype == torch.float32 and sink_q.stride() == (0, 0, 0) and rest.data_ptr() != 0
    dq, dk, dv, drest = randn(B, T, C, seed=13), randn(B, T, C, seed=14), randn(B, T, C, seed=15), randn(B, T, 6)
    torch.autograd.backward((sink_q, sink_k, v, rest), (dq, dk, dv, drest))
    dx_ref, dw_ref = conv_grads(packed[..., : 3 * C], torch.cat(weights), (dq, dk, dv), 3, 1, 2, head)
    assert rel(packed.grad[..., : 3 * C], dx_ref) <= 1e-5 and torch.equal(packed.grad[..., 3 * C :], drest)
    assert all(rel(w.grad, dw_ref[i * C : (i + 1) * C]) <= 1e-5 for i, w in enumerate(weights))
    assert torch.equal(rest, packed[..., 3 * C :])
    assert rel(q, conv(packed[..., :C], weights[0], 1, 1, 1, head)[0]) <= 1e-5


# ---- the engram gate (ops/engram_gate/triton.py, ops/engram_gate/)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_engram_gate_function_against_float64(dtype):
    # Through the autograd Function: vk one [..., 2d] tensor (the packed matmul's), h's gradient fp32,
    # vk's in its dtype; 3 x 7 rows of 48 (partial tiles and column blocks).
    bt, d = (3, 7), 48
    h = randn(*bt, d, seed=20, scale=3.0).requires_grad_()
    vk = randn(*bt, 2 * d, seed=21, scale=0.1, dtype=dtype).requires_grad_()
    g = randn(*bt, d + 3, seed=22, dtype=dtype)[..., :d]  # a row stride of its own
    w_h, w_k = (randn(d, seed=23 + i, scale=0.3).add(1.5).requires_grad_() for i in range(2))
    out = engram_gate._gate_packed(h, vk, w_h, w_k, 1e-6, 1e-5)
    got = torch.autograd.grad(out, [h, vk, w_h, w_k], g)
    ref_out, want = gate_grads(h, vk, w_h, w_k, g, 1e-6, 1e-5)
    assert out.dtype == got[1].dtype == dtype and got[0].dtype == torch.float32
    assert rel(out, ref_out) <= TOL[dtype]
    for name, x, ref in zip(("h", "vk", "w_h", "w_k"), got, want, strict=True):
        assert rel(x, ref) <= TOL[x.dtype], (name, rel(x, ref))


def test_engram_gate_gain_gradient_parts_sum_over_many_programs(monkeypatch):
    # Tiles of 4 rows, 2 a program: 19 programs (the last one's second tile partial), the gains' gradients
    # summed over their parts.
    monkeypatch.setattr(gate_kernels, "TILE", 64)
    monkeypatch.setattr(gate_kernels, "LOOPS", 2)
    n, d = 150, 16
    h, v, k = randn(n, d, seed=30), randn(n, d, seed=31), randn(n, d, seed=32)
    w_h, w_k, g = randn(d, seed=33).add(1.0), randn(d, seed=34).add(1.0), randn(n, d, seed=35)
    out, rstd_h, rstd_k, alpha = gate_kernels.forward(h, v, k, w_h, w_k, 1e-6, 1e-6, d**-0.5)
    dv, dk = torch.empty_like(v), torch.empty_like(k)
    dh, dw_h, dw_k = gate_kernels.backward(h, v, k, w_h, w_k, rstd_h, rstd_k, alpha, g, dv, dk, d**-0.5)
    _, want = gate_grads(h, torch.cat([v, k], -1), w_h, w_k, g, 1e-6, 1e-6)
    assert rel(dw_h, want[2]) <= 1e-5 and rel(dw_k, want[3]) <= 1e-5 and rel(dh, want[0]) <= 1e-5


# ---- the add-norm backward (ops/norm/triton.py) and SwiGLU (ops/swiglu/triton.py)


@pytest.mark.parametrize("with_dsum", [True, False], ids=["sum-gradient", "no-sum-gradient"])
def test_add_norm_backward_kernel_against_float64(with_dsum):
    # y = RMSNorm(s) · w for the fp32 sum s = x + residual: the gradients of x (bf16 here) and of the
    # residual (fp32: plus the sum's own gradient where something read the sum), and of w.
    T, D = 37, 96
    s = randn(T, D, seed=40, scale=3.0).double().requires_grad_()
    w = randn(D, seed=41, scale=0.1).add(1.0).double().requires_grad_()
    dy, dsum = randn(T, D, seed=42, dtype=torch.bfloat16), randn(T, D, seed=43) if with_dsum else None
    y = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + 1e-6) * w
    ds_ref, dw_ref = torch.autograd.grad(y, (s, w), dy.double())
    if with_dsum:
        ds_ref = ds_ref + dsum.double()
    rstd = s.detach().float().square().mean(-1).add(1e-6).rsqrt()
    dx, dres, dw = norm_kernels.backward(dy, s.detach().float(), w.detach().float(), rstd, dsum, torch.bfloat16)
    assert dx.dtype == torch.bfloat16 and dres.dtype == dw.dtype == torch.float32
    assert rel(dx, ds_ref) <= TOL[torch.bfloat16] and rel(dres, ds_ref) <= 1e-5 and rel(dw, dw_ref) <= 1e-5


def test_swiglu_kernels_against_float64():
    n, h = 37, 100
    gate, up, g = randn(n, h, seed=50), randn(n, h, seed=51), randn(n, h, seed=52)
    gd, ud = gate.double().requires_grad_(), up.double().requires_grad_()
    out_ref = torch.nn.functional.silu(gd) * ud
    d_gate_ref, d_up_ref = torch.autograd.grad(out_ref, (gd, ud), g.double())
    d_gate, d_up = torch.empty_like(gate), torch.empty_like(up)
    swiglu_kernels.backward(gate, up, g, d_gate, d_up)
    assert rel(swiglu_kernels.forward(gate, up), out_ref) <= 1e-5
    assert rel(d_gate, d_gate_ref) <= 1e-5 and rel(d_up, d_up_ref) <= 1e-5


# ---- the optimizers' and the tables' kernels (train/), through their callers


def stack(*shape, seed):
    """A random fp64 stack [N, m, n] with row 3 of the first matrix and column 5 of the last all zero."""
    u = randn(*shape, seed=seed).double()
    u[0, 3:4] = 0
    u[-1, :, 5:6] = 0
    return u


@pytest.mark.parametrize("shape", [(3, 70, 100), (2, 300, 33), (1, 1, 64), (1, 64, 1)])
def test_sr_sinkhorn_kernels_against_float64(shape, kernels_on_cpu):
    u = stack(*shape, seed=60)
    got = sinkhorn.sr_sinkhorn(u.float(), 5)
    want = sinkhorn_reference.sr_sinkhorn(u, 5, 1e-12)
    assert (got.double() - want).abs().max().item() <= 4e-6
    assert (got[0, 3:4] == 0).all() and (got[-1, :, 5:6] == 0).all() and torch.isfinite(got).all()


def test_sr_sinkhorn_rows_wider_than_a_block(kernels_on_cpu, monkeypatch):
    kernels = sinkhorn.kernels(torch.device("cpu"))
    monkeypatch.setattr(kernels, "ROW_BLOCK", 64)
    monkeypatch.setattr(kernels, "PARTS_AT_ONCE", 2)
    u = stack(2, 150, 130, seed=61)
    assert (
        sinkhorn.sr_sinkhorn(u.float(), 5).double() - sinkhorn_reference.sr_sinkhorn(u, 5, 1e-12)
    ).abs().max() <= 4e-6


@pytest.mark.parametrize("capturable", [False, True], ids=["lr-numbers", "lr-tensors"])
def test_nesterov_sinkhorn_kernel_path_steps_as_float64(capturable, monkeypatch):
    # The CUDA path of the update: the momentum stack and its kernel, the Sinkhorn's last pass writing the
    # step into the weights through their address table; three steps of two shape groups, the third with a
    # skipped step (found_inf 1) that leaves weights and momentum bit for bit; against float64 torch.
    shapes = [(40, 24), (24, 24), (40, 24)]
    w0 = [randn(*s, seed=70 + i).double() for i, s in enumerate(shapes)]
    grads = [[randn(*s, seed=80 + 3 * j + i).double() for i, s in enumerate(shapes)] for j in range(3)]
    results = {}
    for on_kernels, dtype in ((True, torch.float32), (False, torch.float64)):
        monkeypatch.setattr(registry, "on_kernel_device", lambda t, on=on_kernels: on)
        ws = [torch.nn.Parameter(w.to(dtype)) for w in w0]
        opt = optim.NesterovSinkhorn(ws, lr=0.01, weight_decay=0.1, capturable=capturable and on_kernels)
        for j, step in enumerate(grads):
            for w, g in zip(ws, step, strict=True):
                w.grad = g.to(dtype)
            opt.found_inf = torch.tensor(float(j == 1))
            if j == 1:
                before = [w.detach().clone() for w in ws] + [opt.state[w]["momentum_buffer"].clone() for w in ws]
            if opt.capturable:
                opt.load_lr_()
            opt.step()
            if j == 1:
                after = [w.detach() for w in ws] + [opt.state[w]["momentum_buffer"] for w in ws]
                assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        results[on_kernels] = [w.detach() for w in ws] + [opt.state[w]["momentum_buffer"] for w in ws]
    for got, want in zip(results[True], results[False], strict=True):
        assert (got.double() - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("lr", [1e-2, 0.0], ids=["step", "lr-0"])
def test_sparse_row_adam_kernel_path_steps_as_float64(lr, monkeypatch):
    # Four steps of a [70, 8] table: repeated rows, a row whose gradient sums to zero, a skipped step
    # (found_inf 1) that changes nothing; against the torch path in float64; rows never looked up untouched.
    w0 = randn(70, 8, seed=90).double()
    steps = []
    for i in range(4):
        index = torch.randint(0, 60, (300,), generator=rng.generator(0, 91 + i, "test"))
        values = randn(300, 8, seed=95 + i).double()
        values[index == 7] = 0
        steps.append((index, values))
    results = {}
    for on_kernels, dtype in ((True, torch.float32), (False, torch.float64)):
        monkeypatch.setattr(registry, "on_kernel_device", lambda t, on=on_kernels: on)
        w = torch.nn.Parameter(w0.to(dtype))
        opt = SparseRowAdam([w], lr=lr)
        for i, (index, values) in enumerate(steps):
            w.grad = torch.sparse_coo_tensor(index.unsqueeze(0), values.to(dtype), (70, 8), check_invariants=True)
            opt.found_inf = torch.tensor(float(i == 2))
            before = (w.detach().clone(), *(t.clone() for t in opt.state[w].values())) if opt.state[w] else None
            opt.step()
            if i == 2:
                assert all(torch.equal(a, b) for a, b in zip(before, (w.detach(), *opt.state[w].values()), strict=True))
        results[on_kernels] = [w.detach(), *opt.state[w].values()]
    for got, want in zip(results[True], results[False], strict=True):
        if got.dtype == torch.int64:
            assert torch.equal(got, want)
        else:
            assert (got.double() - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    assert torch.equal(results[True][0][60:], w0[60:].float())


@pytest.mark.parametrize("lookups,rows,dim", [(300, 40, 64), (50, 7, 24), (5, 3, 64)])
def test_row_sums_kernel_adds_as_the_torch_path_bit_for_bit(lookups, rows, dim, kernels_on_cpu, monkeypatch):
    # The coalesced sums of a table gradient (RowPlan.coalesce): each distinct row's values added in the
    # plan's order from zero, as the CPU's index_add_ does: the same bits.
    index = torch.randint(0, rows, (lookups,), generator=rng.generator(0, 100, "test"))
    values = randn(lookups, dim, seed=101)
    plan = RowPlan(index)
    got = plan.coalesce(values, rows)
    monkeypatch.setattr(registry, "on_kernel_device", lambda t: False)
    want = plan.coalesce(values, rows)
    assert torch.equal(got.indices(), want.indices()) and torch.equal(got.values(), want.values())
    assert row_sum_kernels._warps(dim) == 1


def test_sinkhorn_step_writes_the_weights_through_their_addresses():
    # W_i <- W_i * decay - lr * X_i; lr 0 and decay 1 (a skipped step) leave the weights bit for bit.
    u = stack(3, 30, 17, seed=110)
    ws = [randn(30, 17, seed=111 + i) for i in range(3)]
    before = [w.double() for w in ws]
    table = torch.tensor([w.data_ptr() for w in ws], dtype=torch.int64)
    sinkhorn_kernels.sinkhorn_step_(u.float(), 5, 1e-12, table, 0.01, 0.999)
    x = sinkhorn_reference.sr_sinkhorn(u, 5, 1e-12)
    for w, b, x_i in zip(ws, before, x, strict=True):
        assert (w.double() - (b * 0.999 - 0.01 * x_i)).abs().max().item() <= 1e-6
    kept = [w.clone() for w in ws]
    sinkhorn_kernels.sinkhorn_step_(u.float(), 5, 1e-12, table, torch.tensor(0.0), torch.tensor(1.0))
    assert all(torch.equal(a, b) for a, b in zip(ws, kept, strict=True))


# ---- the model's step with every dormouse kernel it has


def test_a_model_step_on_the_kernels_equals_the_torch_path(monkeypatch):
    # nano on the CPU with dormouse's kernels wherever the model has them (the KDA layers' and the engram's
    # short convs, SwiGLU, the engram gate with its two norms; the other norms stay torch's: fla is not
    # here), against the same model on torch's paths: the wiring (layouts, strides, the stream's joins)
    # with the real kernels. The loss and every dense gradient within fp32's error (summation orders).
    model_cfg = dataclasses.replace(
        resolve(build("nano"), cuda_available=False).model, norm_backend="plain", engram=True, dropout=0.0
    )
    monkeypatch.setattr(registry, "resolve", lambda name, requested, device: requested.replace("auto", "fused"))
    ids = torch.randint(0, 256, (1, 32), generator=rng.generator(0, 0, "test"))
    results = {}
    for backend in ("fused", "plain"):
        model = DormouseLM(dataclasses.replace(model_cfg, conv_backend=backend, swiglu_backend=backend), seed=0)
        for _, memory in model.memories():
            memory.key_norm.backend = memory.hidden_norm.backend = backend
        for counter in (counters.CONV, counters.SWIGLU, counters.NORM):
            counter.reset()
        loss = model(ids, targets=ids).loss
        loss.backward()
        fused = counters.CONV.fused, counters.SWIGLU.fused, counters.NORM.fused
        assert fused == ((counters.CONV.calls, counters.SWIGLU.calls, 2) if backend == "fused" else (0, 0, 0))
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None and not p.grad.is_sparse}
        results[backend] = loss.item(), grads
    (loss_k, grads_k), (loss_t, grads_t) = results["fused"], results["plain"]
    assert abs(loss_k - loss_t) <= 1e-6 * loss_t and grads_k.keys() == grads_t.keys()
    assert max(rel(grads_k[n], grads_t[n]) for n in grads_t) <= 1e-4
