#!/usr/bin/env bash
# Planned first device call of the next session (not run yet). Write .device-commit first; carry .whl,
# .gpu-data (ts-val = prepare --heldout-tail 0.1 --validation-tail 0.1), .device-commit and .triton-cache.
# Built in session 7 after its device time was spent, none of it yet run on a GPU: the short conv through
# fla's causal_conv1d (--conv-backend fused, the default on CUDA), and two opt-in fla chunk_kda options
# (--kda-safe-gate, --no-kda-recompute). In order of need (the deadline skips what does not fit):
#  1. The conv's GPU test (fused == plain, fp32 and bf16, outputs, tail and gradients; a model runs every
#     conv fused), then the graphed-step test (graph == eager with the new kernel inside the capture).
#  2. Speed, fused conv against torch's in the same call: `small` B 10 T 512 --cuda-graph (the speed goal;
#     23.3 ms with torch's conv) and the candidate's shape (51.4 ms). Their kernel choices are dumped for
#     the pin.
#  3. The KDA gate (fla against the float64 recurrence, bf16) with safe_gate and with disable_recompute,
#     then the candidate's shape benched with each.
#  4. Where a warm start's 9-17 s of `import fla.ops.kda` go (the 10 s goal): -X importtime, 25 slowest.
# Back here: collect_session merges the new kernels' choices into the pin; commit before any A/B (until
# then each process picks them by timing and runs may not repeat). Then next-h200-call2.sh.
# Owed a call with minutes to spare: tests/gpu/test_kda_fla.py in its new form (fp32's IEEE kernels
# took 232 s to compile on a fresh machine).
V=.gpu-data/ts-val
S="--preset small --batch-size 10 --seq-len 512 --dtype bf16 --cuda-graph --data $V"
C="--config configs/tinyshakespeare.toml --data $V"
bench() {  # name, flags, note
  echo "python3 -m dormouse bench $2 --note '$3' > \$OUT/bench-$1.log 2>&1; grep -a -E 'ms_per_step|first_step|kernels' \$OUT/bench-$1.log"
}
gate() {  # name, flags
  echo "python3 benches/kda_gpu_gate.py --dtype bf16 $2 --out \$OUT/gate-$1.json > \$OUT/gate-$1.log 2>&1; cat \$OUT/gate-$1.log"
}
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m pytest -v --durations=0 tests/gpu/test_conv_fused.py tests/gpu/test_graphed_step.py > \$OUT/test-conv.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-conv.log | cut -c1-160 | tail -20" \
  "$(bench small-conv-fused "$S" 'short conv fused')" \
  "$(bench small-conv-plain "$S --conv-backend plain" 'short conv plain (torch)')" \
  "$(bench cand-conv-fused "$C" 'candidate shape, short conv fused')" \
  "$(bench cand-conv-plain "$C --conv-backend plain" 'candidate shape, short conv plain (torch)')" \
  "$(gate default '')" \
  "$(gate safe-gate --safe-gate)" \
  "$(gate no-recompute --no-recompute)" \
  "$(bench cand-safe-gate "$C --kda-safe-gate" 'candidate shape, fla safe_gate')" \
  "$(bench cand-no-recompute "$C --no-kda-recompute" 'candidate shape, fla disable_recompute')" \
  "python3 -X importtime -c 'from dormouse.model import fla_kernels; fla_kernels.chunk_kda(); fla_kernels.causal_conv1d()' 2> \$OUT/importtime.txt; sort -t'|' -k2 -n -r \$OUT/importtime.txt | head -25"
