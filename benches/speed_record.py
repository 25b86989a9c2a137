"""The medians of a side-by-side call (benches/side_by_side.sh) and, asked for, its evidence record.

    python benches/speed_record.py HISTORY [--record evidence/NAME.json --figure TEXT --command TEXT]

Reads the call's history TSV: the dormouse rows and the compiled GPT rows (model gpt-sdpa, compiled yes),
all of one card and one commit. Prints each model's median ms/step and tokens/s over its rounds and the
ratio (the GPT's median ms over dormouse's: above 1, dormouse is faster). The record's value is
dormouse's median ms/step; its row holds both medians, the ratio and every round.
"""

import argparse
import datetime
import json
import statistics
from pathlib import Path

from dormouse.tools.history import read_history


def summary(rows: list[dict[str, str]]) -> dict:
    timed = [r for r in rows if r["model"] == "dormouse" or (r["model"] == "gpt-sdpa" and r["compiled"] == "yes")]
    ours = [r for r in timed if r["model"] == "dormouse"]
    gpt = [r for r in timed if r["model"] == "gpt-sdpa"]
    if not ours or not gpt:
        raise SystemExit("the history needs dormouse rows and compiled GPT rows (benches/side_by_side.sh)")
    for column in ("device", "commit", "batch", "seq_len", "dtype"):
        if len({r[column] for r in timed}) != 1:
            raise SystemExit(f"the rows differ in {column}: one call, one card, one commit and one shape only")
    ms = {
        name: statistics.median(float(r["ms_per_step"]) for r in part) for name, part in (("ours", ours), ("gpt", gpt))
    }
    tokens = int(ours[0]["batch"]) * int(ours[0]["seq_len"])
    return {
        "ms_per_step": round(ms["ours"], 2),
        "tokens_per_s": round(tokens / ms["ours"] * 1000),
        "gpt_compiled_ms": round(ms["gpt"], 2),
        "gpt_tokens_per_s": round(tokens / ms["gpt"] * 1000),
        "ratio_vs_compiled_gpt": round(ms["gpt"] / ms["ours"], 3),
        "arms": ours[0]["arms"],
        "rounds": [
            {
                "model": r["model"],
                "ms_per_step": float(r["ms_per_step"]),
                "ms_iqr": float(r["ms_iqr"]),
                "date": r["date"],
            }
            for r in timed
        ],
        "card": ours[0]["device"],
        "commit": ours[0]["commit"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("history", type=Path)
    parser.add_argument("--record", type=Path, help="write the evidence record here")
    parser.add_argument("--figure", help="the record's figure: what was measured")
    parser.add_argument("--command", help="the record's command: what reproduces it")
    args = parser.parse_args()
    s = summary(read_history(args.history))
    print(
        f"{s['card']}, {s['commit']}: dormouse {s['ms_per_step']} ms/step ({s['tokens_per_s']} tokens/s), "
        f"compiled GPT {s['gpt_compiled_ms']} ms/step; ratio {s['ratio_vs_compiled_gpt']} "
        f"(medians of {len(s['rounds']) // 2} rounds each)"
    )
    if args.record:
        if not (args.figure and args.command):
            raise SystemExit("--record needs --figure and --command")
        card, commit = s.pop("card"), s.pop("commit")
        record = {
            "figure": args.figure,
            "value": s["ms_per_step"],
            "unit": "ms/step",
            "row": s,
            "command": args.command,
            "card": card,
            "commit": commit,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            "source": "rounds of one benches/side_by_side.sh call, fresh processes, dormouse then the GPT each round",
        }
        args.record.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
