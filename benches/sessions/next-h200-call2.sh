#!/usr/bin/env bash
# Planned device calls 2-4 of the next session (not run yet): the context-length A/B that looked best in
# session 6 (T 1024 × B 16, -0.028 in one seed, within the run-to-run spread then), one seed round per
# call: SEED=0, then SEED=1, SEED=2 (about 300 s each). Arm A of SEED=0 is call 1's candidate run
# again: equal eval lines mean runs now repeat across calls. Then, here:
#   python -m dormouse.tools.ab_merge --out benches/logs/<session>/ab-t1024 <the three ab-t1024-s*.json>
# (refused if the code changed between the calls: collect the calls' kernel pins after the last one).
# Carry .whl, .gpu-data, .device-commit, .triton-cache.
V=.gpu-data/ts-val
S=${SEED:-0}
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --seeds 1 --seed $S --record --a '' --b '--seq-len 1024 --batch-size 16' --out /tmp/ab-t1024-s$S > \$OUT/ab-t1024-s$S.log 2>&1; cp /tmp/ab-t1024-s$S/ab.json \$OUT/ab-t1024-s$S.json; grep -a -E '^(overall|ms/step|eval)' \$OUT/ab-t1024-s$S.log | cut -c1-150"
