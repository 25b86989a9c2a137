#!/usr/bin/env bash
# Session 7, device call 4 (run as written; ~250 s of device time were left). Carry .whl, .gpu-data,
# .device-commit, .triton-cache.
#  1. The probe on the code as committed (deterministic mode without its NaN fill of new memory; the probe
#     now reads the eager step's gradients before its clip, so graph and eager compare): two graphed and two
#     eager processes, pairwise and graph against eager.
#  2. The graphed-step GPU test (the DSpark anchors are now made on the device: the capture had refused
#     their host-to-device copy) and the pin test.
#  3. ms/step without the fill: the candidate's shape, and `small` B 10 T 512 --cuda-graph (the speed goal).
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V"
P="env -u DORMOUSE_FLA_DUMP python3 benches/determinism_probe.py $C --steps 5"
exec bash benches/gpu_session.sh \
  "R=\$PWD; mkdir -p \$OUT/probe; for r in 1 2; do $P --out \$OUT/probe/graph\$r.jsonl > \$OUT/probe/graph\$r.log 2>&1 & $P --no-cuda-graph --out \$OUT/probe/eager\$r.jsonl > \$OUT/probe/eager\$r.log 2>&1 & done; wait; cd \$OUT/probe; for a in graph eager; do echo \"== \$a: 1 vs 2\"; python3 \$R/benches/determinism_probe.py --compare \$a\"1.jsonl\" \$a\"2.jsonl\"; done; echo '== graph vs eager'; python3 \$R/benches/determinism_probe.py --compare graph1.jsonl eager1.jsonl" \
  "python3 -m pytest -v --durations=0 tests/gpu/test_fla_pin_gpu.py tests/gpu/test_graphed_step.py > \$OUT/test-graphed.log 2>&1; grep -a -E 'PASS|FAIL|passed|failed|^E ' \$OUT/test-graphed.log | cut -c1-160 | tail -14" \
  "python3 -m dormouse bench $C --note 'candidate shape (T 256, B 64), deterministic mode without the NaN fill' > \$OUT/bench-cand.log 2>&1; grep -a -E 'ms_per_step|tokens_per_s' \$OUT/bench-cand.log" \
  "python3 -m dormouse bench --preset small --batch-size 10 --seq-len 512 --dtype bf16 --cuda-graph --data $V --note 'deterministic mode without the NaN fill' > \$OUT/bench-small.log 2>&1; grep -a -E 'ms_per_step|tokens_per_s|first_step' \$OUT/bench-small.log"
