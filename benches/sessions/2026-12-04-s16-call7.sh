#!/usr/bin/env bash
# Session 16, call 7: call 6's idle line (B 64, profiled): the device idled 11.1 ms a step under the
# profiler, and among the host events then were SparseRowAdam's index_copy_ calls, 1.7 ms a step, which
# deterministic mode runs through index_put_'s sorting path. The rows are distinct (coalesced), so they now
# run with deterministic mode off around them (the same bits), and the trainer copies each batch to the
# GPU without a blocking copy's stream sync (non_blocking: the host queues the step behind the previous
# update instead of waiting for it). Predicted together: up to ~2 ms a step. Not run in session 16 (its
# device time was spent): the next session's first call.
#  1. GPU test: the graphed step still equals the eager one bit for bit.
#  2. B 64 --cuda-graph, two arms twice each, interleaved: 6e318ff (call 6's) and this commit; then this
#     commit profiled (the idle line).
#  3. benches/engram_update_probe.py at small B 64: the eager engram update's time, and whether a dense
#     gradient (deterministic index_add_) and a masked dense lazy-Adam update can be captured, and at what
#     cost: the next lever's design (docs/performance.md, Next).
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree (mkdir -p .base-tree/6e318ff && git archive 6e318ff
# dormouse | tar x -C .base-tree/6e318ff).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
# Session 17 starts with no Triton cache (a fresh checkout): bring the compiled kernels back.
export TRITON_CACHE_BACK=1
cmds=("timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_graphed_step.py > \$OUT/gpu-graphed.log 2>&1; tail -3 \$OUT/gpu-graphed.log")
base="cd .base-tree/6e318ff && DORMOUSE_COMMIT=6e318ff python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
for i in 1 2; do
  cmds+=("$(timed b64-c6-$i "($base --note 'batch 64, 6e318ff, arm $i of 2 arms x 2')")")
  cmds+=("$(timed b64-rows-$i "python3 -m dormouse bench $S --note 'batch 64, SparseRowAdam row writes outside deterministic mode, non-blocking batch copies, arm $i of 2 arms x 2'")")
done
cmds+=("$(timed profile-b64-idle "python3 -m dormouse bench $S --profile 3 --note 'batch 64, profiled with the idle line'" 'ms_per_step|first_step|Error|device busy|device idle')")
cmds+=("timeout 120 python3 benches/engram_update_probe.py --data $V > \$OUT/engram-update-probe.log 2>&1; tail -8 \$OUT/engram-update-probe.log")
exec bash benches/gpu_session.sh "${cmds[@]}"
