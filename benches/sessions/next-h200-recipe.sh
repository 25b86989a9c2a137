#!/usr/bin/env bash
# Planned device call: the recipe's held-out run (--record: a history row), once its config is final
# (every choice made on the validation slice). The held-out tail is read here only: nanoGPT's split,
# prepared by
#   dormouse prepare ../shared/data/tinyshakespeare.txt --heldout-tail 0.1 --out .gpu-data/tinyshakespeare
# The wall time is the whole command's, start-up included (bash's EPOCHREALTIME before and after; the eval
# lines' wall_s count from dormouse's import), with the Triton cache carried (a warm machine) or, with
# COLD=1, from an empty Triton cache (every kernel compiled in the run: nanoGPT's 149 s included its own
# 28 s of compilation). Carry .whl, .gpu-data, .device-commit, .triton-cache. Commit the log,
# metrics.jsonl and curves.png under benches/logs/<session>/recipe.* (the runs of sessions 10 and 12:
# benches/sessions/2026-12-03-s10-call3.sh, 2026-12-03-s12-call3.sh).
D=.gpu-data/tinyshakespeare
cache=${COLD:+TRITON_CACHE_DIR=/tmp/empty-triton-cache }
exec bash benches/gpu_session.sh \
  "s=\$EPOCHREALTIME; ${cache}python3 -m dormouse train --config configs/tinyshakespeare.toml --data $D --out /tmp/recipe --record > \$OUT/recipe.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/recipe.log; cp /tmp/recipe/metrics.jsonl \$OUT/recipe.metrics.jsonl; cp /tmp/recipe/curves.png \$OUT/recipe.curves.png; grep -a -E '^eval|first step' \$OUT/recipe.log | cut -c1-200"
