#!/usr/bin/env bash
# The next device call for the speed issue's open goal, batch 64 at >= 1e6 tokens/s (session 22: 9.71e5,
# 33.75 ms). Session 23 had no device: its two changes have run only on the CPU (the Triton interpreter):
#   - the engram gate fused (model/engram_gate.py: one Triton kernel each way for the two norms, their
#     product, the sigmoid and alpha*v; v and k from one matmul), ~2 GB a step fewer at B 64 by the op
#     inventory;
#   - SR-Sinkhorn as two scale vectors (train/sinkhorn_kernels.py: two reads of the matrix an iteration
#     where there were five passes), ~0.7 GB a step fewer.
# Carry .base-tree with a1ae8ce (session 23's start), .whl, .gpu-data/ts-val, .device-commit, .triton-cache.
#  1. GPU tests: the gate's kernels against float64 and a model's gate fused against plain; the Sinkhorn
#     kernels against fp64 torch; the graphed step (eager parity, the captured update); the norms.
#  2. benches/sinkhorn_probe.py: these Sinkhorn kernels against a1ae8ce's in the same replays.
#  3. The cold start at B 10 (two new kernels compile).
#  4. B 64 interleaved three times: a1ae8ce, this commit; then a profile of this commit.
# Then benches/sessions/next-h200-fla-pin.sh (fla's kernel choices at B 64).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-gate-sinkhorn 300 tests/gpu/test_engram_gate_fused.py tests/gpu/test_sinkhorn_kernels.py tests/gpu/test_graphed_step.py tests/gpu/test_norm_fused.py)")
cmds+=("$(timed sinkhorn-probe "python3 benches/sinkhorn_probe.py --against .base-tree/a1ae8ce/dormouse/train/sinkhorn_kernels.py" 'us|Error')")
cmds+=("$(timed cold-b10 "TRITON_CACHE_DIR=\$(mktemp -d) python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, empty Triton cache (cold start), engram gate fused, Sinkhorn scale vectors'")")
interleaved 3 \
  b64-a1ae8ce "$(base_bench a1ae8ce) --batch-size 64 --note 'batch 64, a1ae8ce (session 23 start), round \$round of 3'" \
  b64-gate-sinkhorn "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, engram gate fused, Sinkhorn scale vectors, round \$round of 3'"
cmds+=("$(timed profile-b64 "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, engram gate fused, Sinkhorn scale vectors, profiled'" 'ms_per_step|Error')")
exec bash benches/gpu_session.sh "${cmds[@]}"
