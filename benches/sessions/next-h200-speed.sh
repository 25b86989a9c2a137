#!/usr/bin/env bash
# Planned device call (not run yet) for the speed issue's open goals, on the defaults of session 9 (fla's
# in-kernel prep, fused input projections). Carry .whl, .gpu-data, .device-commit and .triton-cache.
#  1. Cold start: `small` B 10 bench with an empty Triton cache (the kernels compile, their choices come
#     from the pin): first_step_s, and the whole command's wall time (goal 60 s). First, before anything
#     else warms the machine's page cache.
#  2. Warm start: the same with the carried cache (goal 10 s).
#  3. `dormouse replay` on the H200 (the `small` defaults, step 2): two processes, IDENTICAL or not.
#  4. Profile of `small` B 64 T 512 (6.1e5 tokens/s; goal 1e6): where its 53.8 ms go.
#  5. `small` B 10 with --baselines: dormouse, the SDPA GPT and fla's KDAForCausalLM in one process, so the
#     ratios come from one run (fla-kda never finished before; its kernels are not in the pin).
#  6. `small` B 64 with torch.compile (eager step, no CUDA graph: never measured on a GPU), against 4.
V=.gpu-data/ts-val
S="--preset small --seq-len 512 --dtype bf16 --cuda-graph --data $V"
timed() {  # name, command: the command's wall time appended to its log
  echo "s=\$EPOCHREALTIME; $2 > \$OUT/$1.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/$1.log; grep -a -E 'ms_per_step|first_step|IDENTICAL|DIFFERS' \$OUT/$1.log | cut -c1-200"
}
exec bash benches/gpu_session.sh \
  "$(timed cold "TRITON_CACHE_DIR=/tmp/empty-triton-cache python3 -m dormouse bench $S --batch-size 10 --note 'cold: empty Triton cache'")" \
  "$(timed warm "python3 -m dormouse bench $S --batch-size 10 --note 'warm: Triton cache carried'")" \
  "$(timed replay "python3 -m dormouse replay --preset small --seq-len 512 --batch-size 10 --dtype bf16 --data $V --step 2")" \
  "$(timed profile-b64 "python3 -m dormouse bench $S --batch-size 64 --profile 3 --note 'batch 64, profiled'")" \
  "$(timed baselines "timeout 360 python3 -m dormouse bench $S --batch-size 10 --baselines --note 'dormouse with both baselines in one process'")" \
  "$(timed compile-b64 "timeout 300 python3 -m dormouse bench --preset small --seq-len 512 --dtype bf16 --data $V --batch-size 64 --compile --note 'batch 64, torch.compile, eager step'")"
