"""benches/op_inventory.py: the torch ops of one training step around fla's kernels, counted on the CPU
with the kernels as opaque stand-ins (the fused paths chosen), each op's bytes from its operands."""

import collections
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("op_inventory", ROOT / "benches/op_inventory.py")
op_inventory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(op_inventory)

B, T = 2, 32  # nano: d 128, 2 block layers looped twice (4 mixer applications), SwiGLU 384


def rows(**overrides):
    mode = op_inventory.inventory("nano", B, T, overrides or None)
    return {key: tuple(value) for key, value in mode.rows.items()}


def test_the_fused_paths_run_and_the_stand_ins_hide_fla_s_work():
    found = rows(model={"engram": False})
    ops = {op for op, _, _ in found}
    # The chunked KDA (the CPU path) would solve triangular systems; torch's conv and rms_norm would run.
    assert not ops & {"linalg_solve_triangular", "convolution", "_fused_rms_norm", "rms_norm"}
    # fla's gated output norm: no sigmoid of the gate, no sigmoid backward.
    assert not ops & {"sigmoid", "sigmoid_backward"}
    # fla's SwiGLU kernels: no silu, no split of the packed gate-up projection, so no cat of its gradient.
    assert not ops & {"silu", "silu_backward"} and ("cat", f"[{B}, {T}, 768]", "bf16,bf16->bf16") not in found
    # The pre-norms hand their matmuls bf16, and a branch's output joins the fp32 stream inside the next
    # pre-norm (RMSNorm.add_and_norm: the mixer's in the FFN's, the FFN's in the next layer's mixer's, the
    # last one's in the final norm, which writes the head's bf16): no [B, T, d] cast is left.
    assert not any(op == "_to_copy" and shape == f"[{B}, {T}, 128]" for op, shape, _ in found)
    # No bf16 sum of the two branches, and the output gate's bias added inside its matmul (addmm), its
    # gradient a [1, B·T] x [B·T, 128] matmul in fp32 (projections.affine_of): no bf16 add is left, and
    # the fp32 stream takes no bf16 add.
    assert not any(op == "add" and "bf16" in dtypes for op, _, dtypes in found)
    assert found[("addmm", f"[{B * T}, 128]", "bf16,bf16,bf16->bf16")][0] == 4
    assert found[("mm", "[1, 128]", "bf16,bf16->f32")][0] == 4
    # The KDA layer's fused projection (q, k, v 3 x 128, f_a 32, b 4, g_a 32): the conv kernels write q's,
    # k's and v's gradients into one [B, T, 452] tensor, so no cat of six; the gates' three are views of
    # the projection (no copy forward, no cat of their gradients), each gradient copied into it once
    # per application.
    assert not any(op == "cat" and shape.startswith(f"[{B}, {T}, ") for op, shape, _ in found)
    assert found[("copy_", f"[{B}, {T}, 32]", "bf16,bf16->bf16")][0] == 2 * 4
    assert found[("copy_", f"[{B}, {T}, 4]", "bf16,bf16->bf16")][0] == 4
    # fla's forward and backward under kda_fla's Function: no [B, T, H, K] gradient is cast (q's and k's go
    # to the conv's sinks in fp32; fla's gate backward writes g's in g's dtype).
    assert not any(op == "_to_copy" and shape == f"[{B}, {T}, 4, 32]" for op, shape, _ in found)
    # The block's matmuls as on CUDA under bf16 autocast (projections._Bf16Linear): the packed weight is
    # concatenated straight into bf16 and its gradient comes out of the matmul in fp32, never cast back.
    # Cast once for both applications of a layer (projections.shared_casts), matmuls for each.
    assert found[("cat", "[452, 128]", "f32,f32,f32,f32,f32,f32,bf16->bf16")][0] == 2  # into a bf16 out
    assert found[("mm", "[452, 128]", "bf16,bf16->f32")][0] == 4
    assert ("_to_copy", "[452, 128]", "bf16->f32") not in found


def test_bytes_are_operands_read_plus_output_written_and_views_move_nothing():
    found = rows(model={"engram": False})
    # The fp32 stream's adds (the re-injection's forward, the gradients' sums backward): 4 + 4 bytes read,
    # 4 written per element.
    n, moved = found[("add", f"[{B}, {T}, 128]", "f32,f32->f32")]
    assert n == 3 and moved == n * B * T * 128 * (4 + 4 + 4)
    assert all(moved == 0 for (op, _, _), (_, moved) in found.items() if op in ("view", "t", "_unsafe_view"))


def test_where_names_each_op_s_site():
    mode = op_inventory.inventory("nano", B, T, {"model": {"engram": False}}, where=True)
    sites = collections.defaultdict(set)
    for op, shape, dtypes, site in mode.rows:
        if shape == f"[{B}, {T}, 128]":
            sites[(op, dtypes)].add(site.split(":")[0])
    # The re-injection adds the embedding to the stream in the loop; backward, autograd sums the gradients
    # of the tensors two readers share (the embedding: the first layer's pre-norm and its residual, the
    # re-injection), after the norm's backward.
    assert sites[("add", "f32,f32->f32")] == {"fwd model/loop.py", "bwd _RMSNormToBackward"}


def test_the_engram_gate_runs_fused_on_one_matmul_of_the_looked_up_rows():
    found = rows(model={"engram": True})
    # The gate's two norms, their product and sum, the sigmoid and the scaling of v run in dormouse's
    # kernels (ops/engram_gate/): no sigmoid and no [B, T, 1] op is left anywhere.
    assert not {op for op, _, _ in found} & {"sigmoid", "sigmoid_backward"}
    assert not any(shape == f"[{B}, {T}, 1]" and "f32" in dtypes for _, shape, dtypes in found)
    # v and k from one matmul of the looked-up rows [B, T, 6 arms x 32]: one cast of the rows, one
    # gradient for the packed [2d, 192] weight and one for the rows (no add of two).
    assert found[("_to_copy", f"[{B}, {T}, 192]", "f32->bf16")][0] == 1
    assert found[("mm", "[256, 192]", "bf16,bf16->f32")][0] == 1
    assert not any(op == "add" and shape == f"[{B}, {T}, 192]" for op, shape, _ in found)


def test_the_engram_output_joins_the_stream_in_the_next_pre_norm():
    # The memory's bf16 output waits as the stream's pending branch output (loop.Stream.join) and the next
    # block layer's pre-norm adds it in its kernel: no cast of it to fp32 forward or of its gradient to
    # bf16 backward, no fp32 add of it to the stream. The stream's [B, T, d] casts and adds are those of
    # the model without the memory (the hidden state's gradient from the gate joins the embedding's in
    # the add that the layer's plain pre-norm and residual needed without it).
    with_memory, without = rows(model={"engram": True}), rows(model={"engram": False})
    for op, dtypes in [
        ("_to_copy", "f32->bf16"),
        ("_to_copy", "bf16->f32"),
        ("add", "f32,bf16->f32"),
        ("add", "f32,f32->f32"),
    ]:
        key = (op, f"[{B}, {T}, 128]", dtypes)
        assert with_memory.get(key, (0,))[0] == without.get(key, (0,))[0], key
