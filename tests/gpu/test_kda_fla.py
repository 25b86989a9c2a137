"""fla's chunk_kda against the float64 recurrence on CUDA (gate 5); skipped without CUDA or fla.

The comparison lives in tests/gpu/kda_fla_gate.py, which prints the same numbers as a table. Error of a
tensor: max|x - ref| / max|ref|; tolerances 1e-2 (bf16), 2.5e-3 (tf32) and 1e-3 (fp32). Each dtype's gate runs
in a process of its own: Triton's fp32 precision is fixed per process (precision.apply refuses a
change, so `--dtype fp32` never runs TF32 kernels compiled by earlier GPU tests). fp32 means
IEEE fp32 dots in fla's Triton kernels.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
# fla through dormouse, never directly: fla reads the kernel pin's variables once, at its import, and a
# direct import before them left every kernel to Triton's timing (minutes of autotuning, other kernels).
from dormouse.ops.fla import kernels as fla_kernels  # noqa: E402

if fla_kernels.chunk_kda()[0] is None:
    pytest.skip(f"needs fla-core (extra `gpu`): {fla_kernels.chunk_kda()[1]}", allow_module_level=True)

from dormouse import counters, rng  # noqa: E402
from dormouse.model import precision  # noqa: E402
from dormouse.model.kda_layer import KDALayer  # noqa: E402
from dormouse.ops.kda.fla import chunk_kda_sunk  # noqa: E402

GATE = Path(__file__).resolve().parent / "kda_fla_gate.py"
_spec = importlib.util.spec_from_file_location("kda_fla_gate", GATE)
gate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate)


@pytest.fixture(scope="module", params=["bf16", "fp32", "tf32"])
def fla_errors(request, tmp_path_factory):
    report = tmp_path_factory.mktemp("gate") / f"{request.param}.json"
    # Exit status 1 means a tensor over the gate: the test below names it; no report means it crashed.
    run = subprocess.run([sys.executable, str(GATE), "--dtype", request.param, "--out", str(report)])
    assert report.exists(), f"the gate crashed (exit {run.returncode})"
    return request.param, json.loads(report.read_text())["errors"]


@pytest.mark.parametrize("tensor", ["o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"])
def test_fla_matches_float64_recurrence(fla_errors, tensor):
    dtype, errors = fla_errors
    assert errors[tensor] <= gate.TOLERANCE[dtype], f"{tensor}: {errors[tensor]:.3e}"


@pytest.mark.parametrize(
    "options",
    [{}, {"fla_safe_gate": True}, {"fla_prep_in_kernel": True}, {"fla_safe_gate": True, "fla_prep_in_kernel": True}],
    ids=["default", "safe_gate", "prep_in_kernel", "safe_gate+prep_in_kernel"],
)
def test_layer_on_cuda_runs_fla_and_matches_chunked(options):
    # The gate's B, T, H, K: fla's kernel choices for it are then already made. TF32 dots, as the other
    # GPU tests in this process run them (IEEE fp32 is the gate's, in its own process).
    precision.apply("tf32")
    layer = KDALayer(128, 8, 64, generator=rng.generator(0, 0, "init"), **options).cuda()
    x = torch.randn(10, 512, 128, generator=rng.generator(0, 0, "test")).cuda()
    counters.KDA.reset()
    y = layer(x)
    assert (counters.KDA.fused, counters.KDA.calls) == (1, 1)
    y.square().mean().backward()
    grads = {name: [p.grad.clone() for p in params] for name, params in layer.param_groups().items()}
    for name, got in grads.items():
        assert all(g.abs().max() > 0 for g in got), name
    layer.zero_grad()
    layer.backend = "chunked"
    ref = layer(x)
    ref.square().mean().backward()
    # TF32 dots put fla's KDA at up to 1.35e-3 of the float64 recurrence (docs/known-issues.md): a
    # wiring check at bf16's tolerance; the gate above holds fp32 to 1e-3. Every parameter's gradient
    # too: with prep_in_kernel, A_log's and dt_bias's come from fla's gate kernel.
    assert gate.rel_err(ref.detach(), y.detach().double()) <= gate.TOLERANCE["bf16"]
    for name, params in layer.param_groups().items():
        for got, p in zip(grads[name], params, strict=True):
            assert gate.rel_err(p.grad, got.double()) <= gate.TOLERANCE["bf16"], name


def test_in_kernel_gate_reads_bf16_input_with_the_cast_s_bits():
    # The op hands fla's in-kernel gate the projection's bf16 output uncast (ops/kda/ `gated`): fla loads
    # it as fp32 and rounds its gradient once to bf16, as a cast to fp32 and that cast's backward would:
    # the output and the gate's gradient bit for bit, A_log's and dt_bias's gradients to fp32 rounding.
    fn = fla_kernels.chunk_kda()[0]
    gen = rng.generator(0, 0, "test")
    B, T, H, K = 4, 512, 8, 64
    q, k, v = (torch.randn(B, T, H, K, generator=gen).cuda().bfloat16() for _ in range(3))
    f = torch.randn(B, T, H, K, generator=gen).cuda().bfloat16()
    b = torch.randn(B, T, H, generator=gen).cuda().bfloat16()
    A_log = torch.randn(H, generator=gen).cuda()
    dt_bias = torch.randn(H * K, generator=gen).cuda()
    do = torch.randn(B, T, H, K, generator=gen).cuda().bfloat16()
    runs = []
    for cast in (True, False):
        g = f.detach().clone().requires_grad_()
        A, bias = A_log.clone().requires_grad_(), dt_bias.clone().requires_grad_()
        o, _ = fn(
            q, k, v, g.float() if cast else g, b,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            A_log=A, dt_bias=bias, lower_bound=-5.0, safe_gate=True,
        )  # fmt: skip
        o.backward(do)
        runs.append((o.detach(), g.grad, A.grad, bias.grad))
    for name, with_cast, uncast in zip(("o", "dg", "dA_log", "ddt_bias"), *runs, strict=True):
        assert with_cast.dtype == uncast.dtype, name
        if name in ("o", "dg"):
            assert torch.equal(with_cast, uncast), name
        else:  # summed in fp32 by code compiled for the other input dtype: equal to fp32 rounding, not bit for
            # bit (dA_log differs in its last bits)
            assert gate.rel_err(uncast, with_cast.double()) <= 1e-6, name


def test_the_sunk_function_is_fla_s_chunk_kda_with_dq_and_dk_unrounded():
    # ops/kda/fla.py's Function runs fla's own forward and backward: against fla's chunk_kda with the same options
    # (the norm not in the kernel: the conv's), the output and v's, g's, beta's, A_log's and dt_bias's
    # gradients bit for bit; q's and k's come in fp32 through the sinks, fla's rounded to bf16 of them.
    fn = fla_kernels.chunk_kda()[0]
    gen = rng.generator(0, 1, "test")
    B, T, H, K = 4, 512, 8, 64
    unit = (torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1) for _ in "qk")
    q, k = (t.cuda().bfloat16() for t in unit)
    v, f = (torch.randn(B, T, H, K, generator=gen).cuda().bfloat16() for _ in "vf")
    b = torch.randn(B, T, H, generator=gen).cuda().bfloat16()
    A_log, dt_bias = torch.randn(H, generator=gen).cuda(), torch.randn(H * K, generator=gen).cuda()
    do = torch.randn(B, T, H, K, generator=gen).cuda().bfloat16()
    options = {"safe_gate": True, "lower_bound": -5.0, "disable_recompute": True}
    runs = []
    for sunk in (False, True):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, f, b, A_log, dt_bias)]
        sinks = [torch.zeros((), device="cuda").expand(B, T, H, K).requires_grad_() for _ in "qk"]
        if sunk:
            o = chunk_kda_sunk(*leaves, *sinks, chunk_size=64, options=options)
        else:
            o, _ = fn(
                *leaves[:5], use_qk_l2norm_in_kernel=False, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                A_log=leaves[5], dt_bias=leaves[6], **options,
            )  # fmt: skip
        o.backward(do)
        dq, dk = (s.grad for s in sinks) if sunk else (leaves[0].grad, leaves[1].grad)
        runs.append((o.detach(), dq, dk, *(t.grad for t in leaves[2:])))
    (o, dq, dk, *rest), (o_s, dq_s, dk_s, *rest_s) = runs
    assert torch.equal(o, o_s) and all(torch.equal(a, c) for a, c in zip(rest, rest_s, strict=True))
    assert dq_s.dtype == dk_s.dtype == torch.float32 and dq.dtype == torch.bfloat16
    assert torch.equal(dq_s.bfloat16(), dq) and torch.equal(dk_s.bfloat16(), dk)
