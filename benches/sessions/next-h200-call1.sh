#!/usr/bin/env bash
# Planned first device call of the next session (not run yet). Write .device-commit first; carry .whl,
# .gpu-data (ts-val = prepare --heldout-tail 0.1 --validation-tail 0.1), .device-commit and .triton-cache.
# The short conv now runs fla's causal_conv1d on CUDA (--conv-backend fused by default), never yet on a GPU:
#  1. Its GPU test (fused == plain, fp32 and bf16, outputs, tail and gradients; a model runs every conv
#     fused), then the graphed-step test (graph == eager with the new kernel inside the capture).
#  2. Its speed, and its kernel choices dumped for the pin: `small` B 10 T 512 --cuda-graph (the speed
#     goal; 23.3 ms with torch's conv) and the candidate's shape (51.4 ms), each with --conv-backend plain
#     beside it in the same call for the ratio.
#  3. Where a warm start's 9-17 s of `import fla.ops.kda` go (the 10 s warm-start goal): Python's
#     -X importtime of dormouse's own fla import, the 25 slowest modules (cumulative) kept.
# Back here: collect_session merges the new kernels' choices into the pin; commit before any A/B (until
# then each process picks them by timing and runs may not repeat). Then next-h200-call2.sh.
# Owed a call with minutes to spare: tests/gpu/test_kda_fla.py in its new form (fp32's IEEE kernels
# took 232 s to compile on a fresh machine).
V=.gpu-data/ts-val
S="--preset small --batch-size 10 --seq-len 512 --dtype bf16 --cuda-graph --data $V"
C="--config configs/tinyshakespeare.toml --data $V"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m pytest -v --durations=0 tests/gpu/test_conv_fused.py tests/gpu/test_graphed_step.py > \$OUT/test-conv.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-conv.log | cut -c1-160 | tail -20" \
  "for b in fused plain; do python3 -m dormouse bench $S --conv-backend \$b --note \"short conv \$b\" > \$OUT/bench-small-\$b.log 2>&1; grep -a -E 'ms_per_step|first_step|kernels' \$OUT/bench-small-\$b.log; done" \
  "for b in fused plain; do python3 -m dormouse bench $C --conv-backend \$b --note \"candidate shape, short conv \$b\" > \$OUT/bench-cand-\$b.log 2>&1; grep -a -E 'ms_per_step|kernels' \$OUT/bench-cand-\$b.log; done" \
  "python3 -X importtime -c 'from dormouse.model import fla_kernels; fla_kernels.chunk_kda(); fla_kernels.causal_conv1d()' 2> \$OUT/importtime.txt; sort -t'|' -k2 -n -r \$OUT/importtime.txt | head -25"
