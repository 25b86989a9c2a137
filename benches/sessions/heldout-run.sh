# Sourced by next-h200-recipe.sh and the session scripts: heldout_run_cmd prints one device command that
# trains on nanoGPT's split (the held-out tail: read only for a config chosen on the validation slice)
# with --record, times the whole command (bash's EPOCHREALTIME before and after, start-up included),
# and copies NAME.log, NAME.metrics.jsonl and NAME.curves.png under $OUT.
#   heldout_run_cmd NAME "<train flags>" [ENV_PREFIX]   (flags may hold \$-escaped device-side variables)
heldout_run_cmd() {
  local name=$1 flags=$2 env=${3:-}
  echo "s=\$EPOCHREALTIME; ${env}python3 -m dormouse train $flags --data .gpu-data/tinyshakespeare --out /tmp/$name --record > \$OUT/$name.log 2>&1; python3 -c \"print(f'wall: {\$EPOCHREALTIME - \$s:.1f} s for the whole command')\" | tee -a \$OUT/$name.log; cp /tmp/$name/metrics.jsonl \$OUT/$name.metrics.jsonl; cp /tmp/$name/curves.png \$OUT/$name.curves.png; tr '\\r' '\\n' < \$OUT/$name.log | grep -a -E '^eval|first step' | cut -c1-200"
}
