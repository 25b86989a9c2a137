#!/usr/bin/env bash
# Session 6, device call 1. Carry .whl, .gpu-data (ts-val = prepare --heldout-tail 0.1 --validation-tail 0.1)
# and .device-commit; the Triton cache comes back (TRITON_CACHE_BACK=1) for the next calls.
#  1. One-seed A/B on the validation slice at the candidate's own budget (2400 steps, evals every 600):
#     arm A the candidate (configs/tinyshakespeare.toml), arm B the attention mixer (nanoGPT's). Arm A
#     also says whether 2400 steps beat 1500 (2.1347). If the update's graph fails to capture, the same
#     A/B again with --no-graph-update (the log says which ran).
#  2. The speed goal's bench (small, B 10, T 512, bf16, --cuda-graph) with and without the update graph.
#  3. The GPU test --cuda-graph == eager bitwise (CUBLAS_WORKSPACE_CONFIG fixed), on warm kernels.
V=.gpu-data/ts-val
AB="python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --seeds 1 --record --a '' --b '--no-kda' --out /tmp/ab-attn"
SHOW="grep -a -E '^(seed|overall|ms/step|verdict|eval)' \$OUT/ab-attn.log | cut -c1-150"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "{ $AB > \$OUT/ab-attn.log 2>&1 || { rm -rf /tmp/ab-attn; echo RETRY-no-graph-update; $AB --no-graph-update; } >> \$OUT/ab-attn.log 2>&1; }; cp /tmp/ab-attn/ab.json \$OUT/ab-attn.json; cp /tmp/ab-attn/ab.png \$OUT/ab-attn.png; for a in a b; do cp /tmp/ab-attn/\$a/seed-*/metrics.jsonl \$OUT/ab-attn.\$a.metrics.jsonl; done; $SHOW" \
  "python3 -m dormouse bench --preset small --dtype bf16 --cuda-graph --note 'forward+backward graph and the update graph'" \
  "python3 -m dormouse bench --preset small --dtype bf16 --cuda-graph --no-graph-update --note 'forward+backward graph, update eager (same call)'" \
  "python3 -m pytest -v -x --durations=0 tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; grep -E 'PASS|FAIL|passed|failed|s call|^E ' \$OUT/test-graphed.log | tail -20"
