#!/usr/bin/env bash
# Planned device call (not run yet) for the speed issue's open goals (start-up and replay were measured in
# session 10: benches/sessions/2026-12-03-s10-call3.sh). Carry .whl, .gpu-data, .device-commit and
# .triton-cache.
# (Run in session 13, 2026-12-03-s13-call1.sh: the engram keys' CUDA test, the graphed decode's GPU test
# and decode rows: 23.54 ms/byte eager, 2.82 with --cuda-graph.)
#  0. `dormouse eval` under the run's autocast reprints a bf16 run's last eval (tests/gpu/test_eval_precision.py).
#  1. Profile of `small` B 64 T 512 (6.1e5 tokens/s; goal 1e6): where its 53.8 ms go.
#  2. The same without the engram (its lookups, sparse gradient and row-wise update run eagerly around
#     the replay, with host syncs): what the engram costs at B 64.
#  3. `small` B 64 with torch.compile under --cuda-graph (Inductor's fused elementwise kernels inside our
#     graph: the profile's elementwise kernels are most of the GPU time), then eagerly (no CUDA graph).
#  4. `small` B 10 in tf32 and in fp32 (IEEE), --cuda-graph (goal 30 ms; not measured since session 4):
#     each in its own process (Triton's fp32 precision is fixed per process).
#  5. Last (it may autotune for minutes): `small` B 10 with --baselines: dormouse, the SDPA GPT and fla's
#     KDAForCausalLM in one process, so the ratios come from one run (fla-kda never finished before).
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --cuda-graph --data $V"
timed() {  # name, command: the command's wall time appended to its log
  echo "s=\$EPOCHREALTIME; $2 > \$OUT/$1.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/$1.log; grep -a -E 'ms_per_step|first_step' \$OUT/$1.log | cut -c1-200"
}
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m pytest -q tests/gpu/test_eval_precision.py > \$OUT/test-eval-precision.log 2>&1; tail -1 \$OUT/test-eval-precision.log" \
  "$(timed profile-b64 "python3 -m dormouse bench $S --dtype bf16 --batch-size 64 --profile 3 --note 'batch 64, profiled'")" \
  "$(timed no-engram-b64 "python3 -m dormouse bench $S --dtype bf16 --batch-size 64 --no-engram --note 'batch 64, engram off'")" \
  "$(timed compile-graph-b64 "timeout 300 python3 -m dormouse bench $S --dtype bf16 --batch-size 64 --compile --note 'batch 64, torch.compile under --cuda-graph'")" \
  "$(timed compile-b64 "timeout 300 python3 -m dormouse bench --preset small --seq-len 512 --dtype bf16 --data $V --batch-size 64 --compile --note 'batch 64, torch.compile, eager step'")" \
  "$(timed tf32 "python3 -m dormouse bench $S --dtype tf32 --batch-size 10 --note 'tf32'")" \
  "$(timed fp32 "python3 -m dormouse bench $S --dtype fp32 --batch-size 10 --note 'fp32 (IEEE Triton dots)'")" \
  "$(timed baselines "timeout 360 python3 -m dormouse bench $S --dtype bf16 --batch-size 10 --baselines --note 'dormouse with both baselines in one process'")"
