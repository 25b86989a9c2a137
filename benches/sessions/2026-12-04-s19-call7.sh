#!/usr/bin/env bash
# Session 19, call 7. Carry .whl, .gpu-data/ts-val, .gpu-data/tinyshakespeare, .device-commit,
# .triton-cache and .base-tree (0f9840a, call 6's code: mkdir -p .base-tree/0f9840a && git archive 0f9840a dormouse | tar x -C ...).
#  1. The quality guard for this session's numerics changes (the output gate's bias added inside its
#     matmul, the engram conv fused, the conv kernels' weight-gradient sums regrouped): the recipe's
#     held-out run at seed 1 (session 18: 1.9774 bpb; sessions 16-17: 1.9820, 1.9731).
#  2. B 64 A/B interleaved twice: 0f9840a against this commit (the sampler's batch built in numpy).
#  3. This commit profiled at B 64; B 10.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
source benches/sessions/heldout-run.sh
export TRITON_CACHE_BACK=1
base="cd .base-tree/0f9840a && DORMOUSE_COMMIT=0f9840a python3 -m dormouse bench ${S/$V/../../$V} --batch-size 64 --history ../../benches/history.tsv --log-dir ../../benches/logs"
cmds=("$(heldout_run_cmd recipe-seed1 "--config configs/tinyshakespeare.toml --seed 1")")
interleaved 2 \
  b64-0f9840a "$base --note 'batch 64, 0f9840a (call 6 code), round \$round of 2'" \
  b64-sampler "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, sampler batch in numpy, round \$round of 2'"
cmds+=("$(timed profile-b64-sampler "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, sampler batch in numpy, profiled'" 'ms_per_step|Error|device busy|device idle|longest')")
cmds+=("$(timed b10-sampler "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, sampler batch in numpy'")")
exec bash benches/gpu_session.sh "${cmds[@]}"
