"""An evidence record (evidence/README.md) of one `dormouse ab` comparison, from its ab.json.

    python benches/ab_record.py AB_JSON evidence/NAME.json --figure TEXT --command TEXT [--source TEXT]

The record's value is arm A's held-out bpb (mean over seeds); its row holds both arms' means, B-A with
its 95 % interval, each seed's pair, the steps and ms/step of each arm and arm B's flags, rounded as the
docs quote them. Card and commit come from ab.json; the date is today's (UTC).
"""

import argparse
import datetime
import json
from pathlib import Path


def record(ab: dict, figure: str, command: str, source: str) -> dict:
    o, r4 = ab["overall"], lambda x: round(x, 4)
    row = {
        "corpus": ab["data"],
        "fingerprint": ab["fingerprint"],
        "steps": ab["steps"],
        "a_bpb_mean": r4(o["a_bpb_mean"]),
        "b_bpb_mean": r4(o["b_bpb_mean"]),
        "b_minus_a": r4(o["diff_mean"]),
        "ci95": [r4(x) for x in o["ci95"]],
        "ms_per_step": {"a": round(o["a_ms_per_step"], 2), "b": round(o["b_ms_per_step"], 2)},
        "per_seed": [{"seed": p["seed"], "a": r4(p["a_bpb"]), "b": r4(p["b_bpb"])} for p in ab["per_seed"]],
        "a_flags": ab["arms"]["a"]["flags"],
        "b_flags": ab["arms"]["b"]["flags"],
    }
    return {
        "figure": figure,
        "value": row["a_bpb_mean"],
        "unit": "bpb",
        "row": row,
        "command": command,
        "card": ab["device"],
        # a merged comparison (dormouse.tools.ab_merge) lists its jobs' commits
        "commit": ab["commit"] if isinstance(ab["commit"], str) else ", ".join(ab["commit"]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "source": source,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ab_json", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--figure", required=True, help="what was measured")
    p.add_argument("--command", required=True, help="what reproduces it")
    p.add_argument("--source", default="one device call of benches/gpu_call.sh; ab.json kept off the repo")
    args = p.parse_args()
    rec = record(json.loads(args.ab_json.read_text()), args.figure, args.command, args.source)
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"{args.out}: A {rec['row']['a_bpb_mean']}, B {rec['row']['b_bpb_mean']}, B-A {rec['row']['b_minus_a']}")


if __name__ == "__main__":
    main()
