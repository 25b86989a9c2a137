#!/usr/bin/env bash
# A device call after next-h200-speed.sh for the speed issue's open goal, batch 64 at >= 1e6 tokens/s (session 22: 9.71e5,
# 33.75 ms; docs/performance.md, Next). Carry .whl, .gpu-data/ts-val, .device-commit and .triton-cache.
#  1. benches/kda_config_probe.py (its first run failed at an RNG purpose in session 22's call 4): every
#     config of fla's four largest KDA kernels at B 64, one layer's mixer forward and backward each, and
#     each 4-warp one with 8 warps (the wy_dqkg backward's pinned config spills ~4 KB a thread with 4,
#     ~0.3 KB with 8: benches/compile_fla_kernels.py, session 23). Its pin, $OUT/kda/pin,
#     is the third B 64 arm below.
#  2. Triton's own B 64 choices for every fla kernel (session 22 call 4: -0.09 ms at the median, kept in
#     benches/logs/2026-12-04-h200-session22-call4/fla-pin-b64) under the GPU tests that run fla's kernels,
#     at B 10, and at B 64 interleaved three times against the committed pin. Pin them if they hold.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
C="FLA_CONFIG_DIR=benches/logs/2026-12-04-h200-session22-call4/fla-pin-b64 FLA_CACHE_MODE=fuzzy"
K=tests/gpu/test_kda_fla.py
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
cmds=("$(timed kda-config-probe "python3 benches/kda_config_probe.py --out \$OUT/kda" 'ms|fastest|Error|not run')")
cmds+=("$C $(pytest_cmd gpu-b64-pin 300 tests/gpu/test_graphed_step.py $K::test_the_sunk_function_is_fla_s_chunk_kda_with_dq_and_dk_unrounded $K::test_layer_on_cuda_runs_fla_and_matches_chunked)")
cmds+=("$(timed b10-pin "python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, committed pin'")")
cmds+=("$(timed b10-b64pin "$C python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, Triton B 64 choices (session 22 call 4)'")")
interleaved 3 \
  b64-pin "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, committed pin, round \$round of 3'" \
  b64-b64pin "$C python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, Triton B 64 choices (session 22 call 4), round \$round of 3'" \
  b64-probepin "if [ -d \$OUT/kda/pin ]; then FLA_CONFIG_DIR=\$OUT/kda/pin FLA_CACHE_MODE=fuzzy python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, kda_config_probe pin, round \$round of 3'; else echo 'no probe pin: Error'; fi"
exec bash benches/gpu_session.sh "${cmds[@]}"
