#!/usr/bin/env bash
# The recipe's cold start on a CUDA card: a run from empty Triton and user caches, then a second run on
# the same machine (seeds 0, then 1). Prints, per run, the seconds of the whole command and the trainer's
# "precompile" and "first step" lines.
#   bash benches/cold_start.sh CORPUS OUT_DIR [CONFIG [train flags ...]]
# CORPUS: dormouse prepare FILE --heldout-tail 0.1; e.g. train flags --precompile.
# Empties $TRITON_CACHE_DIR (default ~/.triton/cache) and uses a fresh XDG_CACHE_HOME under OUT_DIR.
set -uo pipefail
corpus=${1:?CORPUS}
out=${2:?OUT_DIR}
config=${3:-configs/tinyshakespeare.toml}
shift $(($# < 3 ? $# : 3))
triton_cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
rm -rf "${triton_cache:?}"/* "$out/xdg"
mkdir -p "$out"
for seed in 0 1; do
  run=$([[ $seed == 0 ]] && echo cold || echo second)
  started=$EPOCHREALTIME
  XDG_CACHE_HOME="$out/xdg" python3 -m dormouse train --config "$config" --data "$corpus" --seed "$seed" \
    --out "$out/run-$run" --record --history "$out/recipe.tsv" "$@" >"$out/$run.log" 2>&1
  rc=$?
  whole=$(python3 -c "print(round($EPOCHREALTIME - $started, 1))")
  echo "$run: rc $rc, whole command $whole s; $(tr '\r' '\n' <"$out/$run.log" | grep -a -E '^(precompile|first step)' | head -2 | paste -sd ';')"
done
