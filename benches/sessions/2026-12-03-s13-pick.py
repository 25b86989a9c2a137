"""Session 13, call 2: the rule fixed before the call ran. Among the combined candidates (3 seeds each
against the recipe, on the validation slice), those whose 95% interval of Δbpb (B - A) lies below 0 are
eligible; the lowest mean validation bpb among them is picked and its flags printed (last line), and the
call then reads the held-out tail once with them. None eligible: nothing is read (exit 1).
Usage: python3 benches/sessions/2026-12-03-s13-pick.py OUT_DIR PREFIX FLAGS_1 FLAGS_2 ..."""

import json
import sys
from pathlib import Path

out, prefix, flags = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
eligible = {}
for i, f in enumerate(flags, start=1):
    try:
        overall = json.loads((out / f"{prefix}rows-b{i}.json").read_text())["overall"]
    except (OSError, KeyError, ValueError) as err:  # a row cut by the deadline: not a candidate
        print(f"b{i} missing ({err!r}): {f}")
        continue
    ci = overall["ci95"]
    print(f"b{i}: B {overall['b_bpb_mean']:.4f} A {overall['a_bpb_mean']:.4f} Δ {overall['diff_mean']:+.4f} {ci}: {f}")
    if ci is not None and ci[1] < 0:
        eligible[f] = overall["b_bpb_mean"]
if not eligible:
    sys.exit("picked none")
best = min(eligible, key=eligible.get)
print(f"picked {best}")
