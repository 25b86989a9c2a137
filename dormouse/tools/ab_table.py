"""The ablation table of docs/results.md from `dormouse ab` results: one markdown row per A/B.

    python -m dormouse.tools.ab_table "engram off=runs/ab-engram/ab.json" "depth 3=runs/ab-depth/ab.json"

Each row: the label, what arm B changed (its flags), seeds, steps, mean Δbpb (B − A) with its 95%
interval, each arm's ms/step and the verdict, all read from ab.json's `overall` (tools/ab_stats.py made
them); nothing is recomputed, so the table says what the A/B said.
"""

import json
import sys
from pathlib import Path

from dormouse.tools.ab_report import steps_text

HEADER = (
    "| row | B's flags (A: shared config) | seeds | steps | A bpb | Δbpb (B − A) | 95% interval | ms/step A, B "
    "| verdict |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def row(label: str, result: dict) -> str:
    o = result["overall"]
    interval = "none (one seed)" if o["ci95"] is None else f"[{o['ci95'][0]:+.4f}, {o['ci95'][1]:+.4f}]"
    flags = result["arms"]["b"]["flags"] or "(none)"
    cells = (
        label,
        f"`{flags}`",
        str(len(result["seeds"])),
        steps_text(result["steps"]),
        f"{o['a_bpb_mean']:.4f}",
        f"{o['diff_mean']:+.4f}",
        interval,
        f"{o['a_ms_per_step']:.1f}, {o['b_ms_per_step']:.1f}",
        o["verdict"],
    )
    return "| " + " | ".join(cells) + " |"


def table(rows: list[tuple[str, dict]]) -> str:
    return "\n".join([HEADER, *(row(label, result) for label, result in rows)])


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        print("each argument is LABEL=PATH/TO/ab.json", file=sys.stderr)
        return 2
    rows = []
    for arg in argv:
        label, path = arg.split("=", 1)
        rows.append((label, json.loads(Path(path).read_text())))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
