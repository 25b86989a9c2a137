#!/usr/bin/env bash
# Session 19, call 10. Carry .whl, .gpu-data/ts-val, .device-commit, .triton-cache and .base-tree
# (ab68ace, call 8's code: mkdir -p .base-tree/ab68ace && git archive ab68ace dormouse | tar x -C ...).
#  1. The SwiGLU GPU tests: dormouse's kernels against float64 and against fla's bits.
#  2. B 64 A/B interleaved twice: ab68ace against this commit (SwiGLU on dormouse's kernels); B 10.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
base="cd .base-tree/ab68ace && DORMOUSE_COMMIT=ab68ace python3 -m dormouse bench ${S/$V/../../$V} --batch-size 64 --history ../../benches/history.tsv --log-dir ../../benches/logs"
cmds=("$(pytest_cmd gpu-swiglu 120 tests/gpu/test_swiglu_fused.py)")
interleaved 2 \
  b64-ab68ace "$base --note 'batch 64, ab68ace (call 8 code), round \$round of 2'" \
  b64-swiglu "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, SwiGLU on dormouse kernels, round \$round of 2'"
cmds+=("$(timed b10-swiglu "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, SwiGLU on dormouse kernels'")")
exec bash benches/gpu_session.sh "${cmds[@]}"
