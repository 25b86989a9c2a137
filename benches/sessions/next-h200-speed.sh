#!/usr/bin/env bash
# The next device call for the speed issue's open goal, batch 64 at >= 1e6 tokens/s (session 22: 9.71e5,
# 33.75 ms). Session 23 had no device: its changes have run only on the CPU (stand-ins, the Triton
# interpreter), each predicted from the bytes it removes at B 64 (benches/op_inventory.py):
#   - the engram gate fused (model/engram_gate.py: one Triton kernel each way for the two norms, their
#     product, the sigmoid and alpha*v; v and k from one matmul);
#   - the engram output and the last FFN output (re-injection, head) join the stream inside the next
#     pre-norm (loop.Stream.join / output, RMSNorm.add_and_norm for_matmul): no [B, T, d] cast or mixed add
#     is left in the stream; with the gate ~2.6 GB a step (docs/performance.md: the inventory's bytes);
#   - SR-Sinkhorn as two scale vectors (train/sinkhorn_kernels.py): two reads of each matrix an iteration
#     where there were five passes, ~0.7 GB;
#   - NesterovSinkhorn's momentum stacked per shape and updated with the look-ahead in one pass
#     (train/momentum_kernels.py), ~0.6 GB; the Sinkhorn's last pass writes the step into the weights
#     (sinkhorn_step_), ~0.35 GB; SparseRowAdam's rows in one pass (train/row_adam_kernels.py); the
#     tables' row sums one warp a row; the staged rows gathered into the static rows directly.
# Carry .base-tree with a1ae8ce (session 23's start) and ee12c44 (branch s23-model-arm: a1ae8ce with the
# model's changes alone, the gate and the joins), .whl, .gpu-data/ts-val, .device-commit, .triton-cache.
#  1. GPU tests: the gate's kernels against float64 and a model's gate fused against plain; the Sinkhorn
#     and momentum kernels against fp64, SparseRowAdam's kernel against the torch path; the graphed step
#     (eager parity, the captured update) and decode; the norms (the add-norm backward without a sum
#     gradient); the eval's precision; the packed conv against session 24's shared float64 references. Then the pin with fla's wy_dqkg backward at 8 warps (outside fla's
#     Hopper list: its pinned 4-warp config spills ~4 KB a thread, 8 warps ~0.3 KB,
#     benches/logs/2026-12-04-cpu-compile-kernels/fla-kda-bwd-spills.txt) and the KDA layer test under it.
#  2. B 64 interleaved three times: a1ae8ce, ee12c44 (the model's changes), this commit (and the update's),
#     this commit with the 8-warp wy_dqkg pin; then a profile of this commit.
#  3. The cold start at B 10 (new kernels compile), benches/sinkhorn_probe.py against a1ae8ce's kernels.
# Then benches/sessions/next-h200-fla-pin.sh (fla's kernel choices at B 64).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
W="FLA_CONFIG_DIR=\$OUT/pin-wy8 FLA_CACHE_MODE=fuzzy"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-session23 360 tests/gpu/test_engram_gate_fused.py tests/gpu/test_sinkhorn_kernels.py tests/gpu/test_graphed_step.py tests/gpu/test_graphed_decode.py tests/gpu/test_norm_fused.py tests/gpu/test_row_plan.py tests/gpu/test_eval_precision.py tests/gpu/test_conv_fused.py::test_packed_backward_takes_fp32_and_bf16_gradients_in_one_call)")
cmds+=("python3 benches/pin_variant.py \$OUT/pin-wy8 chunk_kda_bwd_kernel_wy_dqkg_fused=8")
cmds+=("$W $(pytest_cmd gpu-wy8 200 tests/gpu/test_kda_fla.py::test_layer_on_cuda_runs_fla_and_matches_chunked tests/gpu/test_kda_fla.py::test_the_sunk_function_is_fla_s_chunk_kda_with_dq_and_dk_unrounded)")
interleaved 3 \
  b64-a1ae8ce "$(base_bench a1ae8ce) --batch-size 64 --note 'batch 64, a1ae8ce (session 23 start), round \$round of 3'" \
  b64-ee12c44 "$(base_bench ee12c44) --batch-size 64 --note 'batch 64, ee12c44 (session 23 model changes: gate, joins), round \$round of 3'" \
  b64-session23 "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, session 23 (gate, joins, Sinkhorn, momentum), round \$round of 3'" \
  b64-wy8 "$W python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, session 23, fla wy_dqkg backward at 8 warps (pin variant), round \$round of 3'"
cmds+=("$(timed profile-b64 "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, session 23 (gate, joins, Sinkhorn, momentum), profiled'" 'ms_per_step|Error')")
cmds+=("$(timed cold-b10 "TRITON_CACHE_DIR=\$(mktemp -d) python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, empty Triton cache (cold start), session 23 (gate, joins, Sinkhorn, momentum)'")")
cmds+=("$(timed sinkhorn-probe "python3 benches/sinkhorn_probe.py --against .base-tree/a1ae8ce/dormouse/train/sinkhorn_kernels.py" 'us|Error')")
exec bash benches/gpu_session.sh "${cmds[@]}"
