#!/usr/bin/env bash
# One row of the corpora table (docs/training.md) in one GPU call: the recipe against the GPT baseline of
# equal parameters (softmax attention, no loop, FFN 1632 wide: 14.36 M parameters against 14.34 M) at
# equal wall-clock (`ab --equal time`: the recipe trains its steps, the baseline what fits in their time),
# 3 seeds. Writes OUT_DIR/ab.json and OUT_DIR/ab.png; the runs stay in a temporary folder.
#   bash benches/corpora_row.sh CORPUS OUT_DIR [ab flags ...]     (e.g. --seeds 1 to try it)
# Its evidence record: python benches/ab_record.py OUT_DIR/ab.json evidence/corpora-NAME.json --figure ... --command ...
set -euo pipefail
corpus=${1:?CORPUS}
out=${2:?OUT_DIR}
shift 2
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
python3 -m dormouse ab --config configs/tinyshakespeare.toml --data "$corpus" --equal time --seeds 3 \
  --a "" --b "--no-kda --depth 1 --ffn-hidden 1632" --out "$runs/ab" "$@"
mkdir -p "$out"
cp "$runs/ab/ab.json" "$runs/ab/ab.png" "$out/"
