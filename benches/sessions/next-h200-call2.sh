#!/usr/bin/env bash
# Planned second device call of the next session (not run yet), after call 1's kernel choices are merged
# into the pin and committed. Carry .whl, .gpu-data, .device-commit and .triton-cache.
# Runs repeat across processes since session 7, so one-seed deltas are seed noise only. Weight decay 0.5
# reached its lowest validation bpb at step 1800 of 2400 and then rose (2.088 -> 2.095), the candidate
# still fell: the next question is weight decay at a budget where nothing has turned yet, with evals every
# 300 steps so the curve's bottom is seen. 1800 steps also leaves the 149 s wall-time budget room for
# start-up. Three A/Bs, arm A (the candidate at 1800 steps) trained once and reused:
#   weight decay 0.5, weight decay 1.0, weight decay 0.5 with dropout 0.3.
V=.gpu-data/ts-val
C="--config configs/tinyshakespeare.toml --data $V --seeds 1 --steps 1800 --eval-every 300 --record"
export TRITON_CACHE_BACK=1
ab() {  # name, arm B's flags, extra ab flags
  echo "python3 -m dormouse ab $C --a '' --b '$2' $3 --out /tmp/$1 > \$OUT/$1.log 2>&1; cp /tmp/$1/ab.json \$OUT/$1.json; for a in a b; do cp /tmp/$1/\$a/seed-0/metrics.jsonl \$OUT/$1.\$a.metrics.jsonl 2>/dev/null; done; grep -a -E '^(overall|ms/step)' \$OUT/$1.log | cut -c1-150"
}
exec bash benches/gpu_session.sh \
  "$(ab ab1800-wd05 '--weight-decay 0.5')" \
  "$(ab ab1800-wd1 '--weight-decay 1.0' '--reuse-a /tmp/ab1800-wd05')" \
  "$(ab ab1800-wd05-drop3 '--weight-decay 0.5 --dropout 0.3' '--reuse-a /tmp/ab1800-wd05')"
