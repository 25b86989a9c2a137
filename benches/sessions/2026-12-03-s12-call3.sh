#!/usr/bin/env bash
# Device call 3 of session 12 (what was left of the device budget, ~200 s): AdamW with both regularisers
# that helped at 1500 steps in call 2 (dropout 0.3: -0.058, weight decay 1.0: -0.035, one seed each,
# against the 1500-step arm A), on the validation slice, at 1000 and 1500 steps. The rule, fixed before
# the call: the lower final validation bpb of the two wins, and only if it beats call 2's pick (the
# 1000-step schedule, 2.0438) does the held-out tail get read, once, with its flags (evals at 1/4 ... end).
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
D=.gpu-data/tinyshakespeare
R="--config configs/tinyshakespeare.toml --opt adamw --dropout 0.3 --weight-decay 1.0 --record"
cmds=()
for n in 1000 1500; do
  cmds+=("python3 -m dormouse train $R --eval-every 250 --data $V --steps $n --out /tmp/rw-$n > \$OUT/rw-$n.log 2>&1; cp /tmp/rw-$n/metrics.jsonl \$OUT/rw-$n.metrics.jsonl; tr '\\r' '\\n' < \$OUT/rw-$n.log | grep -a -E '^eval' | cut -c1-40")
done
pick="python3 -c \"import json,sys; f=lambda n: [r for r in map(json.loads, open(f'\$OUT/rw-{n}.metrics.jsonl')) if r.get('kind')=='eval'][-1]['bpb']; s={n: f(n) for n in (1000, 1500)}; n=min(s, key=s.get); print(s, 'picked', n if s[n] < 2.0438 else 'none'); sys.exit(0 if s[n] < 2.0438 else 1); \" > \$OUT/pick3.txt; cat \$OUT/pick3.txt"
cmds+=("$pick; n=\$(sed -E 's/.*picked ([0-9]+).*/\\1/' \$OUT/pick3.txt); [[ \$n =~ ^[0-9]+\$ ]] || exit 0; s=\$EPOCHREALTIME; python3 -m dormouse train $R --steps \$n --eval-every \$((n / 4)) --data $D --out /tmp/recipe-rw > \$OUT/recipe-rw.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/recipe-rw.log; cp /tmp/recipe-rw/metrics.jsonl \$OUT/recipe-rw.metrics.jsonl; cp /tmp/recipe-rw/curves.png \$OUT/recipe-rw.curves.png; tr '\\r' '\\n' < \$OUT/recipe-rw.log | grep -a -E '^eval|first step' | cut -c1-200")
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
