#!/usr/bin/env bash
# Train a config once under each of several flag sets (one seed) and print each run's result line (its
# best held-out eval) and its evals. For choosing a recipe on a validation slice.
#   bash benches/sweep.sh CORPUS OUT_DIR CONFIG "FLAGS" ["FLAGS" ...]
# JOBS=N (default 1) trains N at a time on the one device: each run's bpb is as alone, its ms/step is not.
# Run again with the same arguments, it resumes each run that was stopped before its result line (e.g. by
# a device call's limit) and leaves the finished ones: a sweep longer than one call takes several.
# A stop sent to the sweep's process group (Ctrl-C; `timeout`'s SIGTERM) reaches every run, which
# checkpoints at its next step boundary; the sweep waits for them, so none is killed mid-save with its
# run lock left behind, and starts no further run.
set -uo pipefail
corpus=${1:?CORPUS}
out=${2:?OUT_DIR}
config=${3:?CONFIG}
shift 3
mkdir -p "$out"
one_run() { # INDEX FLAGS
  local run="$out/run-$1" rc=0
  trap : INT TERM # the run itself gets the stop; this shell waits for it and still reports
  if ! grep -aq '^result' "$run.log" 2>/dev/null; then
    if compgen -G "$run/ckpt/step-*" >/dev/null; then
      python3 -m dormouse train --resume "$run" --data "$corpus" >>"$run.log" 2>&1 || rc=$?
    else
      # shellcheck disable=SC2086  # FLAGS is split into flags on purpose
      python3 -m dormouse train --config "$config" --data "$corpus" --out "$run" $2 >"$run.log" 2>&1 || rc=$?
    fi
  fi
  echo "run-$1 [$2] rc $rc: $(tr '\r' '\n' <"$run.log" | grep -a '^result' | tail -1)"
}
stopping=0
trap 'stopping=1' INT TERM
i=0
for flags in "$@"; do
  i=$((i + 1))
  while (($(jobs -pr | wc -l) >= ${JOBS:-1})); do wait -n; done
  ((stopping)) && break
  one_run "$i" "$flags" &
done
while [[ -n "$(jobs -pr)" ]]; do wait; done # a trapped stop ends one wait early: wait again
for log in "$out"/run-*.log; do
  echo "== $log"
  tr '\r' '\n' <"$log" | grep -a -E '^(first step|eval|result)' | cut -c1-110
done
