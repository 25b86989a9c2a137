#!/usr/bin/env bash
# Session 18, call 3 (the session's last ~9 min of device time). Under bf16 autocast on CUDA the block's
# bias-free matmuls run as projections._Bf16Linear: weights concatenated straight into bf16 (one kernel
# for autocast's cat + cast) and the weights' gradient written in fp32 by the matmul (no bf16 gradient and
# cast back): ~100 fewer small kernels a `small` step (op inventory, --where), ~0.5 ms predicted.
#  1. GPU tests: the Sinkhorn kernels (their accessor now refuses by itself); the bf16 matmul against autocast's Linear (output, input gradient bit for bit; weight
#     gradient fp32).
#  2. B 64 --cuda-graph, three arms x 2 interleaved: call 2's code (e9dd6ab); this commit; this commit
#     with --no-kda-recompute (fla keeps the forward's intermediates: ~1 ms of kernels by call 2's profile).
#  3. The graphed step's GPU test (graphed == eager bit for bit), B 10 at this commit, the graphed decode
#     and eval-precision tests (the decode's matmuls take the same path).
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree (mkdir -p .base-tree/e9dd6ab &&
# git archive e9dd6ab dormouse | tar x -C .base-tree/e9dd6ab).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=(
  "$(pytest_cmd gpu-projections-sinkhorn 120 tests/gpu/test_projections_cuda.py tests/gpu/test_sinkhorn_kernels.py)"
)
base="cd .base-tree/e9dd6ab && DORMOUSE_COMMIT=e9dd6ab python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
for i in 1 2; do
  cmds+=("$(timed b64-base-$i "($base --note 'batch 64, e9dd6ab, arm $i of 3 arms x 2')")")
  cmds+=("$(timed b64-bf16mm-$i "python3 -m dormouse bench $S --note 'batch 64, bf16 matmuls with fp32 weight gradients, arm $i of 3 arms x 2'")")
  cmds+=("$(timed b64-norecompute-$i "python3 -m dormouse bench $S --no-kda-recompute --note 'batch 64, bf16 matmuls, --no-kda-recompute, arm $i of 3 arms x 2'")")
done
cmds+=("$(pytest_cmd gpu-graphed-step 180 tests/gpu/test_graphed_step.py)")
cmds+=("$(timed b10 "python3 -m dormouse bench --preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 10 --note 'batch 10, bf16 matmuls with fp32 weight gradients'")")
cmds+=("$(pytest_cmd gpu-decode-eval 120 tests/gpu/test_graphed_decode.py tests/gpu/test_eval_precision.py)")
exec bash benches/gpu_session.sh "${cmds[@]}"
