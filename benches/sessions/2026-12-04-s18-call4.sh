#!/usr/bin/env bash
# Session 18, call 4. `kda_recompute` now defaults to off (fla keeps the forward's intermediates: call 3
# measured 39.42 / 39.98 ms against 41.60 / 42.20 with recompute at B 64, 10.24 GiB against 8.44).
#  1. The graphed step's GPU test under the new default (graphed == eager bit for bit).
#  2. B 64 --cuda-graph defaults twice, then profiled; B 10.
#  3. fla's KDA GPU tests (the layer with each fla option, the gate).
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-graphed-step 150 tests/gpu/test_graphed_step.py)")
for i in 1 2; do
  cmds+=("$(timed b64-default-$i "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, defaults (kda_recompute off), run $i of 2'")")
done
cmds+=("$(timed profile-b64 "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, defaults (kda_recompute off), profiled'" 'ms_per_step|first_step|Error|device busy|device idle')")
cmds+=("$(timed b10 "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, defaults (kda_recompute off)'")")
cmds+=("$(pytest_cmd gpu-kda 150 tests/gpu/test_kda_fla.py)")
exec bash benches/gpu_session.sh "${cmds[@]}"
