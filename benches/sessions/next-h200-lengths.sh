#!/usr/bin/env bash
# Planned device call (not run yet): the recipe's schedule length, with the pick fixed before the call.
# configs/tinyshakespeare.toml (session 13) was still improving at its last eval (1000 steps; seed 0 on
# the validation slice 1.9715, seeds 0-2 mean 1.9696). Each length in LENGTHS (default "1500 2000") is
# one `dormouse train` of the config on the validation slice (its own cosine, evals at quarters). The
# rule: the length with the lowest final validation bpb is picked if it is under 1.9715 (the config's
# seed 0, the same seed); only then is the held-out tail read, once, with that length (recipe-len.*,
# curves.png). Wall time of each command is printed (the issue's budget: 149 s, start-up included).
# Carry .whl, .gpu-data, .device-commit and .triton-cache.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --record"
LENGTHS=${LENGTHS:-1500 2000}
cmds=()
for n in $LENGTHS; do
  cmds+=("python3 -m dormouse train $C --steps $n --eval-every $((n / 4)) --data $V --out /tmp/len-$n > \$OUT/len-$n.log 2>&1; cp /tmp/len-$n/metrics.jsonl \$OUT/len-$n.metrics.jsonl; tr '\\r' '\\n' < \$OUT/len-$n.log | grep -a -E '^eval' | cut -c1-40")
done
pick="python3 -c \"import json,sys; f=lambda n: [r for r in map(json.loads, open(f'\$OUT/len-{n}.metrics.jsonl')) if r.get('kind')=='eval'][-1]['bpb']; s={n: f(n) for n in '$LENGTHS'.split()}; n=min(s, key=s.get); ok=s[n] < 1.9715; print(s, 'picked', n if ok else 'none'); sys.exit(0 if ok else 1)\" > \$OUT/pick-len.txt 2>&1; cat \$OUT/pick-len.txt"
source benches/sessions/heldout-run.sh
cmds+=("$pick; n=\$(sed -nE 's/.*picked ([0-9]+)\$/\\1/p' \$OUT/pick-len.txt); [[ \$n =~ ^[0-9]+\$ ]] || exit 0; $(heldout_run_cmd recipe-len "--config configs/tinyshakespeare.toml --steps \$n --eval-every \$((n / 4))")")
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh "${cmds[@]}"
