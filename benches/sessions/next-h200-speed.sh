#!/usr/bin/env bash
# Device call written in session 19 and run as session 20's call 1 (benches/logs/2026-12-04-h200-session20/), for the speed issue's open goal, batch 64 at
# >= 1e6 tokens/s (session 19: 9.29e5, 35.29 ms; docs/performance.md, Next). Carry .whl, .gpu-data/ts-val,
# .device-commit, .triton-cache and .base-tree (ab68ace: mkdir -p .base-tree/ab68ace && git archive
# ab68ace dormouse | tar x -C .base-tree/ab68ace).
#  1. The graphed step's GPU test after the SwiGLU kernels changed (10ff17a; not re-run in session 19).
#  2. B 64 A/B interleaved three times: ab68ace against this commit (SwiGLU on dormouse's kernels: -0.66
#     ms of kernels predicted; session 19's call 10 was within its machine's spread), then profiled.
#  3. The cold start with this session's new Triton kernels (the unrolled and dilated conv, the SwiGLU):
#     B 10 from an empty Triton cache (goal: first step within 60 s; 22.9 s in session 10).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(pytest_cmd gpu-graphed-step 150 tests/gpu/test_graphed_step.py)")
interleaved 3 \
  b64-ab68ace "$(base_bench ab68ace) --batch-size 64 --note 'batch 64, ab68ace (fla SwiGLU), round \$round of 3'" \
  b64-head "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, SwiGLU on dormouse kernels, round \$round of 3'"
cmds+=("$(timed profile-b64 "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, profiled'" 'ms_per_step|Error|device busy|device idle|longest')")
cmds+=("$(timed cold-b10 "TRITON_CACHE_DIR=\$(mktemp -d) python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, empty Triton cache (cold start)'")")
exec bash benches/gpu_session.sh "${cmds[@]}"
