#!/usr/bin/env bash
# Session 14, call 1: the recipe's schedule length (next-h200-lengths.sh, with 3000 added), the pick fixed
# before the call, then the first speed items of next-h200-speed.sh (eval precision test, the B 64 profile,
# B 64 without the engram). Carry .whl, .gpu-data, .device-commit and .triton-cache.
# configs/tinyshakespeare.toml (session 13) was still improving at its last eval (1000 steps; seed 0 on
# the validation slice 1.9715). Each length is one `dormouse train` of the config on the validation slice
# (its own cosine, evals at quarters), timed (start-up included). The rule: among lengths whose command
# took at most 140 s (the issue's budget is 149 s), the one with the lowest final validation bpb is picked
# if it is under 1.9715 (the config's seed 0, the same seed); only then is the held-out tail read, once,
# with that length (recipe-len.*, curves.png).
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --record"
LENGTHS="1500 2000 3000"
S="--preset small --seq-len 512 --cuda-graph --data $V"
cmds=("python3 -m pytest -q tests/gpu/test_eval_precision.py > \$OUT/test-eval-precision.log 2>&1; tail -1 \$OUT/test-eval-precision.log")
for n in $LENGTHS; do
  cmds+=("s=\$EPOCHREALTIME; python3 -m dormouse train $C --steps $n --eval-every $((n / 4)) --data $V --out /tmp/len-$n > \$OUT/len-$n.log 2>&1; python3 -c \"print(f'{\$EPOCHREALTIME - \$s:.1f}')\" > \$OUT/len-$n.wall; cp /tmp/len-$n/metrics.jsonl \$OUT/len-$n.metrics.jsonl; tr '\\r' '\\n' < \$OUT/len-$n.log | grep -a -E '^eval' | cut -c1-40; cat \$OUT/len-$n.wall")
done
pick="python3 -c \"import json,sys; f=lambda n: [r for r in map(json.loads, open(f'\$OUT/len-{n}.metrics.jsonl')) if r.get('kind')=='eval'][-1]['bpb']; w=lambda n: float(open(f'\$OUT/len-{n}.wall').read()); s={n: f(n) for n in '$LENGTHS'.split() if w(n) <= 140}; n=min(s, key=s.get); ok=s[n] < 1.9715; print(s, 'picked', n if ok else 'none'); sys.exit(0 if ok else 1)\" > \$OUT/pick-len.txt 2>&1; cat \$OUT/pick-len.txt"
source benches/sessions/heldout-run.sh
cmds+=("$pick; n=\$(sed -nE 's/.*picked ([0-9]+)\$/\\1/p' \$OUT/pick-len.txt); [[ \$n =~ ^[0-9]+\$ ]] || exit 0; $(heldout_run_cmd recipe-len "--config configs/tinyshakespeare.toml --steps \$n --eval-every \$((n / 4))")")
source benches/sessions/timed.sh
cmds+=("$(timed profile-b64 "python3 -m dormouse bench $S --dtype bf16 --batch-size 64 --profile 3 --note 'batch 64, profiled'")")
cmds+=("$(timed no-engram-b64 "python3 -m dormouse bench $S --dtype bf16 --batch-size 64 --no-engram --note 'batch 64, engram off'")")
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
