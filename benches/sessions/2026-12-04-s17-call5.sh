#!/usr/bin/env bash
# Session 17, call 5 (the session's last ~6 min of device time). The FFN's output now joins the stream
# inside the next block layer's pre-norm (RMSNorm.add_and_norm again, with dormouse's backward kernel):
# 6 of a step's 8 mixer pre-norms at `small`; predicted ~16 bytes an element less at each, ~0.5 ms a step.
#  1. GPU tests: the graphed step (graphed == eager, bit for bit), the norms, the graphed decode.
#  2. B 64 --cuda-graph: call 3's code (e75e770) and this commit, twice each, interleaved; this one profiled.
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree (mkdir -p .base-tree/e75e770 &&
# git archive e75e770 dormouse | tar x -C .base-tree/e75e770).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
cmds=(
  "$(pytest_cmd gpu-graphed-step 120 tests/gpu/test_graphed_step.py)"
  "$(pytest_cmd gpu-norm-decode 90 tests/gpu/test_norm_fused.py tests/gpu/test_graphed_decode.py)"
)
base="cd .base-tree/e75e770 && DORMOUSE_COMMIT=e75e770 python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
for i in 1 2; do
  cmds+=("$(timed b64-c3-$i "($base --note 'batch 64, e75e770, arm $i of 2 arms x 2')")")
  cmds+=("$(timed b64-pending-$i "python3 -m dormouse bench $S --note 'batch 64, the FFN output added in the next pre-norm, arm $i of 2 arms x 2'")")
done
cmds+=("$(timed profile-b64-pending "python3 -m dormouse bench $S --profile 3 --note 'batch 64, the FFN output added in the next pre-norm, profiled'" 'ms_per_step|first_step|Error|device busy|device idle|add_norm_bwd|layer_norm_bwd')")
exec bash benches/gpu_session.sh "${cmds[@]}"
