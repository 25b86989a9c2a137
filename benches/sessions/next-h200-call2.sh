#!/usr/bin/env bash
# Planned second device call of the next session (not run yet): one-seed A/Bs on the validation slice for
# the recipe's open choices, each against the candidate (configs/tinyshakespeare.toml, 1500 steps): the
# attention mixer instead of KDA (nanoGPT's), and a small engram table (4,096 rows per arm: hashed n-grams
# shared by many contexts, which may generalise where 65,536 rows memorised). Carry .whl, .gpu-data,
# .device-commit and .triton-cache (from the first call's TRITON_CACHE_BACK parts). The second A/B
# reuses the first's arm A (--reuse-a): one baseline run, not two.
V=.gpu-data/ts-val
AB="python3 -m dormouse ab --config configs/tinyshakespeare.toml --data $V --seeds 1 --record"
export TRITON_CACHE_BACK=1
exec bash benches/gpu_session.sh \
  "$AB --a '' --b '--no-kda' --out /tmp/ab-attn > \$OUT/ab-attn.log 2>&1; cp /tmp/ab-attn/ab.json \$OUT/ab-attn.json; grep -a -E '^(seed|overall|ms/step)' \$OUT/ab-attn.log" \
  "$AB --a '' --b '--engram --engram-rows 4096' --reuse-a /tmp/ab-attn --out /tmp/ab-engram4k > \$OUT/ab-engram4k.log 2>&1; cp /tmp/ab-engram4k/ab.json \$OUT/ab-engram4k.json; grep -a -E '^(seed|overall|ms/step)' \$OUT/ab-engram4k.log"
