#!/usr/bin/env bash
# The next device call for the speed issue's open goal, batch 64 at >= 1e6 tokens/s (session 22: 9.71e5,
# 33.75 ms). Session 23 had no device: its changes have run only on the CPU (stand-ins, the Triton
# interpreter), each predicted from the bytes it removes at B 64 (benches/op_inventory.py):
#   - the engram gate fused (model/engram_gate.py: one Triton kernel each way for the two norms, their
#     product, the sigmoid and alpha*v; v and k from one matmul): ~1.5 GB a step;
#   - the engram output and the last FFN output (re-injection, head) join the stream inside the next
#     pre-norm (loop.Stream.join / output, RMSNorm.add_and_norm for_matmul): no [B, T, d] cast or mixed add
#     is left in the stream, ~1.3 GB;
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
#     (eager parity, the captured update) and decode;
#     the norms (the add-norm backward without a sum gradient); the eval's precision.
#  2. benches/sinkhorn_probe.py: these Sinkhorn kernels against a1ae8ce's in the same replays.
#  3. The cold start at B 10 (two new kernels compile).
#  4. B 64 interleaved three times: a1ae8ce, ee12c44 (the model's changes), this commit (and the update's);
#     then a profile of this commit.
# Then benches/sessions/next-h200-fla-pin.sh (fla's kernel choices at B 64).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-session23 360 tests/gpu/test_engram_gate_fused.py tests/gpu/test_sinkhorn_kernels.py tests/gpu/test_graphed_step.py tests/gpu/test_graphed_decode.py tests/gpu/test_norm_fused.py tests/gpu/test_row_plan.py tests/gpu/test_eval_precision.py)")
cmds+=("$(timed sinkhorn-probe "python3 benches/sinkhorn_probe.py --against .base-tree/a1ae8ce/dormouse/train/sinkhorn_kernels.py" 'us|Error')")
cmds+=("$(timed cold-b10 "TRITON_CACHE_DIR=\$(mktemp -d) python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, empty Triton cache (cold start), session 23 (gate, joins, Sinkhorn, momentum)'")")
interleaved 3 \
  b64-a1ae8ce "$(base_bench a1ae8ce) --batch-size 64 --note 'batch 64, a1ae8ce (session 23 start), round \$round of 3'" \
  b64-ee12c44 "$(base_bench ee12c44) --batch-size 64 --note 'batch 64, ee12c44 (session 23 model changes: gate, joins), round \$round of 3'" \
  b64-session23 "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, session 23 (gate, joins, Sinkhorn, momentum), round \$round of 3'"
cmds+=("$(timed profile-b64 "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, session 23 (gate, joins, Sinkhorn, momentum), profiled'" 'ms_per_step|Error')")
exec bash benches/gpu_session.sh "${cmds[@]}"
