#!/usr/bin/env bash
# dormouse against the torch.compile'd GPT baseline of the same sizes, side by side in one call: ROUNDS
# rounds, each a fresh `dormouse bench` process then a fresh `--model gpt --compile` one, on the same
# card with the same flags. Rows go to OUT_DIR/history.tsv, logs to OUT_DIR/logs; prints each model's
# median ms/step over the rounds and the ratio (benches/speed_record.py, which also writes the records).
#   bash benches/side_by_side.sh OUT_DIR ROUNDS [bench flags ...]
#   bash benches/side_by_side.sh $OUT/b64 3 --preset small --batch-size 64 --seq-len 512 --dtype bf16 \
#     --cuda-graph --dropout 0 --byte-noise 0 --ema-decay 0
set -uo pipefail
out=${1:?OUT_DIR}
rounds=${2:?ROUNDS}
shift 2
mkdir -p "$out/logs"
for ((r = 1; r <= rounds; r++)); do
  for model in dormouse gpt; do
    extra=()
    [[ $model == gpt ]] && extra=(--model gpt --compile)
    python3 -m dormouse bench "$@" "${extra[@]}" --history "$out/history.tsv" --log-dir "$out/logs" \
      --note "side by side, round $r of $rounds" >"$out/logs/$model-$r.out" 2>&1 ||
      echo "$model round $r failed: $(tail -1 "$out/logs/$model-$r.out")"
  done
done
python3 "$(dirname "$0")/speed_record.py" "$out/history.tsv"
