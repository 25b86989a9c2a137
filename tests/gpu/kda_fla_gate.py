"""KDA GPU gate: fla's chunk_kda against the float64 recurrence (run by tests/gpu/test_kda_fla.py).

For one dtype per process — bf16, fp32 (IEEE fp32 dots) or tf32 (Triton's TF32 dots), set through
dormouse.model.precision before any kernel compiles — it compares the output, the final state and the
gradients of q, k, v, g, beta and the initial state of `kda(..., backend="fla")` against
`kda_recurrent` in float64 on the same inputs upcast, prints the errors and a sha256 of fla's outputs
and gradients (run it in two processes to compare them bitwise), and writes a JSON report. Timings are
`dormouse bench --op kda`, not this script.

    python tests/gpu/kda_fla_gate.py --dtype bf16 --out gate-bf16.json     # on CUDA, fla installed

Error of a tensor: max|x - ref| / max|ref| (gated), and ‖x − ref‖/‖ref‖ (reported). Exit status 1
when an error is over its tolerance.
"""

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from dormouse.config import ModelConfig  # noqa: E402
from dormouse.model import precision
from dormouse.ops.fla import pin as fla_pin  # noqa: E402
from dormouse.ops.kda import kda  # noqa: E402
from dormouse.ops.kda.fla import fla_options  # noqa: E402
from dormouse.ops.kda.reference import kda_recurrent  # noqa: E402
from dormouse.tools.bench.device import fla_version  # noqa: E402
from dormouse.tools.kda_op import forward_backward, make_inputs  # noqa: E402

SHAPE = (10, 512, 8, 64)  # B, T, H, K (= V): the `small` preset's KDA at batch 10
# The gate on max|d|/max|ref|, a few unit roundoffs of the dots' inputs: bf16 keeps 8 mantissa bits
# (u = 3.9e-3), TF32 11 (u = 4.9e-4: its 512-step chains land at 1.0-1.35e-3), fp32 24.
TOLERANCE = {"bf16": 1e-2, "fp32": 1e-3, "tf32": 2.5e-3}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}
NAMES = ("q", "k", "v", "g", "beta", "h0")


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).abs().max() / ref.abs().max()).item()


def norm_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ (Frobenius): reported beside the gate's max-based error, not gated."""
    return ((x.double() - ref).norm() / ref.norm()).item()


def compare_fla(dtype: str, shape=SHAPE, seed=0, options: dict | None = None):
    """Errors of fla against the float64 recurrence, and a sha256 of fla's outputs and gradients.
    The caller has applied `precision.apply(dtype)` before the first kernel of this process compiled.
    `options` (kda.fla_options) choose among fla's kernels; with safe_gate the gates are clamped to its bound."""
    options = options or {}
    leaves, do, dS = make_inputs(shape, TORCH_DTYPE[dtype], "cuda", seed, gate_floor=options.get("lower_bound"))
    start = time.perf_counter()
    o, S, grads = forward_backward(kda, leaves, do, dS, backend="fla", fla_options=options)
    torch.cuda.synchronize()
    print(f"  fla forward+backward, first call (compiles and autotunes when cold): {time.perf_counter() - start:.1f} s")
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    o_ref, S_ref, ref_grads = forward_backward(kda_recurrent, ref_leaves, do.double(), dS.double())
    pairs = {"o": (o, o_ref), "final_state": (S, S_ref)}
    pairs |= {f"d{n}": (x, r) for n, x, r in zip(NAMES, grads, ref_grads, strict=True)}
    errors = {name: rel_err(x, r) for name, (x, r) in pairs.items()}
    norms = {name: norm_err(x, r) for name, (x, r) in pairs.items()}
    digest = hashlib.sha256()
    for t in (o, S, *grads):
        digest.update(t.detach().contiguous().flatten().view(torch.uint8).cpu().numpy().tobytes())
    return errors, norms, digest.hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=sorted(TOLERANCE), required=True, help="one per process (see docstring)")
    p.add_argument("--shape", help="B,T,H,K (K = V); default 10,512,8,64")
    p.add_argument("--out", required=True, help="path of the JSON report")
    p.add_argument(
        "--safe-gate",
        action="store_true",
        help="fla's safe_gate, gates bounded at gate_lower_bound's default (kda_safe_gate)",
    )
    p.add_argument("--no-recompute", action="store_true", help="fla's disable_recompute (--no-kda-recompute)")
    args = p.parse_args()
    bound = ModelConfig().gate_lower_bound  # the layer's default
    options = fla_options(safe_gate=args.safe_gate, lower_bound=bound, recompute=not args.no_recompute)

    shape = tuple(int(n) for n in args.shape.split(",")) if args.shape else SHAPE
    precision_note = precision.apply(args.dtype)
    print(f"{args.dtype}: {precision_note}; {fla_pin.pin_note()}", flush=True)
    errors, norms, digest = compare_fla(args.dtype, shape, options=options)
    tol = TOLERANCE[args.dtype]
    print(f"{args.dtype}: fla vs float64 recurrence at B,T,H,K={shape} (gate: max|d|/max|ref| <= {tol:g})")
    print(f"  {'tensor':12s} {'max|d|/max|ref|':>16s} {'|d|/|ref|':>10s}")
    over = [t for t, e in errors.items() if e > tol]
    for tensor, err in errors.items():
        print(f"  {tensor:12s} {err:16.3e} {norms[tensor]:10.3e}  {'OVER' if tensor in over else 'ok'}")
    print(f"  sha256 of fla outputs+grads: {digest}")
    print(f"  kernel choices not from the pin: {fla_pin.count_unpinned()}")
    report = {
        "dtype": args.dtype,
        "precision": precision_note,
        "pin": fla_pin.pin_note(),
        "shape_BTHK": shape,
        "fla_options": options,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "fla": fla_version(),
        "tolerance": tol,
        "errors": errors,
        "norm_errors": norms,
        "sha256": digest,
        "over": over,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
