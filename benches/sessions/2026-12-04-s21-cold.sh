#!/usr/bin/env bash
# Session 21, call 5: the cold start with the one-launch q/k/v conv (its kernels compile at the first step),
# then B 10 warm; the graphed step's GPU tests at this commit.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed cold-b10-qkconv "TRITON_CACHE_DIR=\$(mktemp -d) python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, empty Triton cache (cold start), one-launch q/k/v conv'")")
cmds+=("$(timed warm-b10-qkconv "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, one-launch q/k/v conv'")")
cmds+=("$(pytest_cmd gpu-graphed-step-final 200 tests/gpu/test_graphed_step.py)")
exec bash benches/gpu_session.sh "${cmds[@]}"
