#!/usr/bin/env bash
# Session 17, call 3. Call 2's profile: add_and_norm cut the step's kernels by 0.47 ms (39.81 ms busy), but
# fla's layer-norm backward with a residual gradient took 146 us a call (1.8 TB/s) where it runs at 3.1
# without one. dormouse's own kernel (model/norm_kernels.py: each program loads its rows whole first)
# replaces it: predicted ~86 us a call, ~0.5 ms a step.
#  1. GPU tests, each with its own limit: the new kernel against fla's, add_and_norm fused vs plain (a loss
#     linear in the outputs this time), the gate's bits, the graphed step and the graphed decode.
#  2. B 64 --cuda-graph: call 2's commit (41d081a) and this one, twice each, interleaved; this one profiled.
#  3. B 10 at this commit (the issue's first goal, <= 20 ms).
# Carry .whl, .gpu-data, .device-commit, .triton-cache and .base-tree (mkdir -p .base-tree/41d081a &&
# git archive 41d081a dormouse | tar x -C .base-tree/41d081a).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V --batch-size 64"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=(
  "$(pytest_cmd gpu-norm 150 tests/gpu/test_norm_fused.py "'tests/gpu/test_kda_fla.py::test_in_kernel_gate_reads_bf16_input_with_the_cast_s_bits'")"
  "$(pytest_cmd gpu-graphed-step 180 tests/gpu/test_graphed_step.py)"
)
base="cd .base-tree/41d081a && DORMOUSE_COMMIT=41d081a python3 -m dormouse bench ${S/$V/../../$V} --history ../../benches/history.tsv --log-dir ../../benches/logs"
for i in 1 2; do
  cmds+=("$(timed b64-c2-$i "($base --note 'batch 64, 41d081a, arm $i of 2 arms x 2')")")
  cmds+=("$(timed b64-addnormk-$i "python3 -m dormouse bench $S --note 'batch 64, add_and_norm backward by dormouse kernel, arm $i of 2 arms x 2'")")
done
cmds+=("$(timed profile-b64-addnormk "python3 -m dormouse bench $S --profile 3 --note 'batch 64, add_and_norm backward by dormouse kernel, profiled'" 'ms_per_step|first_step|Error|device busy|device idle|add_norm_bwd|layer_norm_bwd')")
cmds+=("$(timed b10 "python3 -m dormouse bench ${S/--batch-size 64/--batch-size 10} --note 'batch 10, session 17'")")
cmds+=("$(pytest_cmd gpu-graphed-decode 100 tests/gpu/test_graphed_decode.py)")
exec bash benches/gpu_session.sh "${cmds[@]}"
