#!/usr/bin/env bash
# Session 21, call 4: which q/k/v conv to keep. Carry .base-tree with 7c1ea88 (session 20's end) and
# 7864a68+nonorm (7864a68's package with KDALayer._project's fuse_norm set to False: the three convs in one
# launch each way, fla's l2norm kernels on q and k as before; `git archive 7864a68 dormouse` then that sed).
#  1. The conv kernels against float64 (the norm path's new backward blocks); the probe.
#  2. B 64 interleaved three times: 7c1ea88, this commit (q and k normalised in the conv), 7864a68+nonorm.
#  3. Profiles of the two variants.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-conv-blocks 200 tests/gpu/test_conv_fused.py)")
cmds+=("$(timed qkv-conv-probe-c4 "python3 benches/qkv_conv_probe.py" 'us|Error')")
interleaved 3 \
  b64-7c1ea88-c4 "$(base_bench 7c1ea88) --batch-size 64 --note 'batch 64, 7c1ea88 (session 20 end), call 4 round \$round of 3'" \
  b64-norm "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, q k normalised in the one-launch conv, round \$round of 3'" \
  b64-nonorm "$(base_bench 7864a68+nonorm) --batch-size 64 --note 'batch 64, one-launch conv without the norm (fla l2norm), round \$round of 3'"
cmds+=("$(timed profile-b64-norm "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, q k normalised in the one-launch conv, profiled'" 'ms_per_step|Error|device busy|device idle')")
cmds+=("$(timed profile-b64-nonorm "$(base_bench 7864a68+nonorm) --batch-size 64 --profile 3 --note 'batch 64, one-launch conv without the norm, profiled'" 'ms_per_step|Error|device busy|device idle')")
exec bash benches/gpu_session.sh "${cmds[@]}"
