#!/usr/bin/env bash
# Session 22, call 3: fla's forward and backward under dormouse's Function (model/kda_fla.py), q's and k's
# gradients handed to the fused conv in fp32 through its sinks (no `dq.to(q)` casts: 16 a step at B 64,
# ~0.4 ms of kernels in session 21's profile); the conv's backward takes fp32 and bf16 gradients (two
# launches). Carry .base-tree with e85e1cc (the session's start) and 4d7ab56 (this session's previous
# commit: the projection's rest as views, the shared weight casts).
#  1. GPU tests: the conv kernels (fp32 and bf16 gradients in one call), the sunk Function against fla's
#     chunk_kda and the layer against the chunked form (test_kda_fla.py without its float64 gates, run in
#     session 21), the graphed step (eager parity through the new path), the projections.
#  2. The cold start at B 10 (the conv's backward compiles a second variant).
#  3. B 64 interleaved three times: e85e1cc, 4d7ab56, this commit; then a profile of this commit.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
source benches/sessions/timed.sh
export TRITON_CACHE_BACK=1
K=tests/gpu/test_kda_fla.py
cmds=("$(pytest_cmd gpu-sinks 300 tests/gpu/test_conv_fused.py tests/gpu/test_graphed_step.py tests/gpu/test_projections_cuda.py $K::test_the_sunk_function_is_fla_s_chunk_kda_with_dq_and_dk_unrounded $K::test_layer_on_cuda_runs_fla_and_matches_chunked $K::test_in_kernel_gate_reads_bf16_input_with_the_cast_s_bits)")
cmds+=("$(timed cold-b10-sinks "TRITON_CACHE_DIR=\$(mktemp -d) python3 -m dormouse bench $S --batch-size 10 --note 'batch 10, empty Triton cache (cold start), q k gradients through sinks'")")
interleaved 3 \
  b64-e85e1cc "$(base_bench e85e1cc) --batch-size 64 --note 'batch 64, e85e1cc (session 22 start), round \$round of 3'" \
  b64-4d7ab56 "$(base_bench 4d7ab56) --batch-size 64 --note 'batch 64, 4d7ab56 (shared weight casts), round \$round of 3'" \
  b64-sinks "python3 -m dormouse bench $S --batch-size 64 --note 'batch 64, q k gradients through sinks, round \$round of 3'"
cmds+=("$(timed profile-b64-sinks "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, q k gradients through sinks, profiled'" 'ms_per_step|Error')")
exec bash benches/gpu_session.sh "${cmds[@]}"
