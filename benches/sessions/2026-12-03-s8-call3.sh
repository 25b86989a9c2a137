#!/usr/bin/env bash
# Session 8, a short device call for what little device time the refused starts left (call 2 never got a
# machine). Carry .whl, .gpu-data, .device-commit and .triton-cache. Verifies on the H200 what was built
# since call 1: the KDA layer with fla's in-kernel prep against the
# chunked form (outputs and every gradient), then benches in one call: the candidate's shape with the
# defaults and with --kda-prep-in-kernel, and `small` B 10 T 512 (the first-step line gives fla's import
# without its package __init__s).
V=.gpu-data/ts-val
bench() {  # name, flags, note
  echo "python3 -m dormouse bench $2 --note '$3' > \$OUT/bench-$1.log 2>&1; grep -a -E 'ms_per_step|tokens_per_s|first_step|import|kernels' \$OUT/bench-$1.log | cut -c1-200"
}
C="--config configs/tinyshakespeare.toml --data $V"
exec bash benches/gpu_session.sh \
  "python3 -m pytest -v tests/gpu/test_kda_fla.py -k layer > \$OUT/test-layer.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-layer.log | cut -c1-160 | tail -12" \
  "$(bench cand "$C" 'candidate shape, defaults (safe_gate)')" \
  "$(bench cand-prep "$C --kda-prep-in-kernel" 'candidate shape, fla in-kernel prep')" \
  "$(bench small-b10 "--preset small --seq-len 512 --batch-size 10 --dtype bf16 --cuda-graph --data $V" 'defaults (safe_gate, lean fla import)')"
