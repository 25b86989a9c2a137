#!/usr/bin/env bash
# Planned first device call of the next session (not run yet). Write .device-commit first, carry .whl,
# .gpu-data (with ts-val: prepare --heldout-tail 0.1 --validation-tail 0.1) and .device-commit, and
# .triton-cache once a call has brought kernels back (TRITON_CACHE_BACK=1: copy its tc.tgz.part_* there).
#  1. The candidate recipe on the validation slice for twice its steps (3000), evals every 375: does
#     validation bpb keep falling past 1500 (2.1347 there)? The command's [N s] stamps give its wall time.
#  2. The GPU test that --cuda-graph equals eager bitwise, now with CUBLAS_WORKSPACE_CONFIG fixed, on
#     the kernels step 1 compiled (same widths and shape).
#  3. The speed goal's bench (small, B 10, T 512, bf16) with --cuda-graph, with and without the update's
#     second graph (--no-graph-update), in the same call. fla's KDAForCausalLM baseline needs a call
#     of its own (it autotunes for minutes on a cold machine).
V=.gpu-data/ts-val
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m dormouse train --config configs/tinyshakespeare.toml --data $V --steps 3000 --eval-every 375 --ckpt-every 3000 --out /tmp/r-cand > \$OUT/r-cand-3000.log 2>&1; cp /tmp/r-cand/metrics.jsonl \$OUT/r-cand-3000.metrics.jsonl; grep -a '^eval' \$OUT/r-cand-3000.log | cut -c1-60" \
  "python3 -m pytest -v -x --durations=0 tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; grep -E 'PASS|FAIL|passed|failed|s call|^E ' \$OUT/test-graphed.log | tail -20" \
  "python3 -m dormouse bench --preset small --dtype bf16 --cuda-graph --note 'forward+backward graph and the update graph'" \
  "python3 -m dormouse bench --preset small --dtype bf16 --cuda-graph --no-graph-update --note 'forward+backward graph, update eager (same call)'"
