#!/usr/bin/env bash
# Session 15, call 2: fla's fused SwiGLU kernels (model/swiglu.py, --swiglu-backend, auto = fused on CUDA),
# and the pre-norms that feed one matmul writing bf16 themselves (RMSNorm.feeds_one_matmul: the same values).
# Predicted at B 64 (call 1's eager profile, per step): torch's silu, mul and silu_backward over
# [64, 512, 1536] are ~5.1 ms; the fused kernels move ~0.8 GB forward and ~1.2 GB backward a step (~0.6 ms at
# ~3.5 TB/s) and the packed gradient drops the [64, 512, 3072] cat of the split's backward (~0.8 ms): about
# -5 ms of 55.7 (call 1, graphed B 64), to ~50 ms (~6.5e5 tokens/s).
#  1. GPU tests: the fused SwiGLU against float64 (tests/gpu/test_swiglu_fused.py), and the graphed step and
#     decode still equal to eager with it (the fused path is inside both graphs now).
#     The norms: 16 casts of [64, 512, 512] fp32 -> bf16 forward and 16 back a step (~0.2 GB each) and half
#     the norm kernels' output and gradient traffic: ~8 GB, ~2 ms predicted.
#  2. B 64 --cuda-graph, three arms twice each, interleaved, in one call: the session's start (the package
#     at 598edc3, carried in .base-tree/, with --swiglu-backend plain: a163674's step), 598edc3 (SwiGLU fused)
#     and this commit (SwiGLU fused, the norms' bf16 outputs).
#  3. B 10 --cuda-graph fused (the <= 20 ms goal's row).
#  4. B 64 --cuda-graph fused profiled: the new "device busy" line says how much of the step the GPU idles.
#  5. The recipe on nanoGPT's split with the new default (its held-out number was measured with torch's
#     SwiGLU, 1.9769): seed 0, the same command as session 14.
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
source benches/sessions/heldout-run.sh
export TRITON_CACHE_BACK=1
cmds=("timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_swiglu_fused.py tests/gpu/test_norm_fused.py tests/gpu/test_graphed_step.py tests/gpu/test_graphed_decode.py > \$OUT/gpu-tests.log 2>&1; tail -15 \$OUT/gpu-tests.log")
# From inside .base-tree, whose package comes first on sys.path ('' precedes PYTHONPATH under -m).
base="cd .base-tree && DORMOUSE_COMMIT=$(cat .base-tree/COMMIT) python3 -m dormouse bench ${S/$V/../$V} --history ../benches/history.tsv --log-dir ../benches/logs"
for i in 1 2; do
  cmds+=("$(timed b64-start-$i "($base --batch-size 64 --swiglu-backend plain --note 'batch 64, the session start (598edc3 with swiglu plain), arm $i of 3 arms x 2')")")
  cmds+=("$(timed b64-swiglu-$i "($base --batch-size 64 --note 'batch 64, swiglu fused (598edc3), arm $i of 3 arms x 2')")")
  cmds+=("$(timed b64-norm-$i "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, swiglu fused and bf16 pre-norm outputs, arm $i of 3 arms x 2'")")
done
cmds+=("$(timed b10-fused "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, swiglu fused'")")
cmds+=("$(timed profile-b64-fused "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, swiglu fused, profiled'" 'ms_per_step|first_step|Error|device busy')")
cmds+=("$(heldout_run_cmd recipe-swiglu "--config configs/tinyshakespeare.toml")")
exec bash benches/gpu_session.sh "${cmds[@]}"
