#!/usr/bin/env bash
# Session 21, call 3: the q/k-normalising conv with its 1/norm kept from the forward and the swept blocks.
#  1. GPU tests: the conv kernels against float64; the graphed step alone.
#  2. The probe again (the backward with the kept 1/norm).
#  3. B 64 A/B interleaved three times: 7c1ea88 (session 20's end) against this commit; then profiled.
#  4. fla's KDA gates and the graphed step in one process, as call 1 ran them (its one-sync test failed).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-conv-rstd 200 tests/gpu/test_conv_fused.py)")
cmds+=("$(pytest_cmd gpu-graphed-step-rstd 200 tests/gpu/test_graphed_step.py)")
cmds+=("$(timed qkv-conv-probe-rstd "python3 benches/qkv_conv_probe.py" 'us|Error')")
interleaved 3 \
  b64-7c1ea88-c3 "$(base_bench 7c1ea88) --batch-size 64 --note 'batch 64, 7c1ea88 (session 20 end), call 3 round \$round of 3'" \
  b64-rstd "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, qk-norm conv with kept 1/norm, swept blocks, round \$round of 3'"
cmds+=("$(timed profile-b64-rstd "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, qk-norm conv with kept 1/norm, profiled'" 'ms_per_step|Error|device busy|device idle')")
cmds+=("$(pytest_cmd gpu-kda-then-graphed 200 tests/gpu/test_kda_fla.py tests/gpu/test_graphed_step.py)")
exec bash benches/gpu_session.sh "${cmds[@]}"
