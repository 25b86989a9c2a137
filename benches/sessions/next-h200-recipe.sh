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
source benches/sessions/heldout-run.sh
cache=${COLD:+TRITON_CACHE_DIR=/tmp/empty-triton-cache }
exec bash benches/gpu_session.sh "$(heldout_run_cmd recipe "--config configs/tinyshakespeare.toml" "$cache")"
