"""Session 12, call 2: pick the lowest final validation bpb among the AdamW candidates (rule fixed before
the call ran) and print its flags; the call then reads the held-out tail once, with those flags.
Usage: python3 benches/sessions/2026-12-03-s12-pick.py OUT_DIR  (prints a table, last line: the flags)"""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])


def final_eval_bpb(metrics: Path) -> float:
    evals = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("kind") == "eval"]
    return evals[-1]["bpb"]


def ab_arm_bpb(ab_json: Path, arm: str) -> float:
    seeds = json.loads(ab_json.read_text())["per_seed"]
    return sum(s[f"{arm}_bpb"] for s in seeds) / len(seeds)


# name -> (flags on top of the config + --opt adamw, where its final validation bpb is)
candidates = {
    "len1000": ("--steps 1000", lambda: final_eval_bpb(out / "len-1000.metrics.jsonl")),
    "len1500": ("--steps 1500", lambda: ab_arm_bpb(out / "r-lr1e3.json", "a")),
    "len2000": ("--steps 2000", lambda: final_eval_bpb(out / "len-2000.metrics.jsonl")),
    "lr1e3": ("--steps 1500 --lr 1e-3", lambda: ab_arm_bpb(out / "r-lr1e3.json", "b")),
    "drop3": ("--steps 1500 --dropout 0.3", lambda: ab_arm_bpb(out / "r-drop3.json", "b")),
    "wd1": ("--steps 1500 --weight-decay 1.0", lambda: ab_arm_bpb(out / "r-wd1.json", "b")),
}
scores = {}
for name, (flags, read) in candidates.items():
    try:
        scores[name] = read()
    except (OSError, KeyError, IndexError, ValueError) as err:  # a run cut by the deadline: not a candidate
        print(f"{name}: missing ({err!r})")
        continue
    print(f"{name}: {scores[name]:.4f}  {flags}")
if not scores:
    sys.exit("no candidate finished")
best = min(scores, key=scores.get)
print(f"picked {best}")
print(candidates[best][0])
