#!/usr/bin/env bash
# Session 16, call 5: call 4's profile put the GPU's kernels at 40.5 ms of a ~46-50 ms step (B 64): the GPU
# idles while the host runs the eager engram update (the tables' sparse gradients coalesced, SparseRowAdam's
# row step, AdamW) between the graph replays. Measured here: what the engram costs at B 64 now, as two
# arms twice each, interleaved, in one call: the defaults, and --no-engram. Predicted: the no-engram arm
# ~6 ms faster (session 14: 4.9 ms, when the GPU work was 50 ms and hid more of the host's).
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=()
for i in 1 2; do
  cmds+=("$(timed b64-engram-$i "python3 -m dormouse bench $S --note 'batch 64, defaults (engram on), arm $i of 2 arms x 2'")")
  cmds+=("$(timed b64-no-engram-$i "python3 -m dormouse bench $S --no-engram --note 'batch 64, --no-engram, arm $i of 2 arms x 2'")")
done
exec bash benches/gpu_session.sh "${cmds[@]}"
