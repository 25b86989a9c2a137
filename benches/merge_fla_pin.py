"""Merge fla kernel choices dumped on the device (DORMOUSE_FLA_DUMP, fla's file format) into the pin.

    python benches/merge_fla_pin.py <dump dir> [dormouse/model/fla_configs/NVIDIA_H200]

Entries already pinned are kept as they are (the pin is never re-decided); only keys the pin lacks are
added. Prints the count added per kernel file.
"""

import json
import sys
from pathlib import Path

from dormouse.model.fla_kernels import UNPINNED_FILE

PIN = Path(__file__).resolve().parents[1] / "dormouse/model/fla_configs/NVIDIA_H200"


def merge(dump: Path, pin: Path) -> dict[str, int]:
    added = {}
    for src in sorted(p for p in dump.glob("*.json") if p.name != UNPINNED_FILE):
        target = pin / src.name
        new = json.loads(src.read_text())
        have = json.loads(target.read_text()) if target.exists() else {**new, "autotune_entries": {}}
        entries = have["autotune_entries"]
        fresh = {k: v for k, v in new["autotune_entries"].items() if k not in entries}
        if fresh:
            have["autotune_entries"] = dict(sorted({**entries, **fresh}.items()))
            target.write_text(json.dumps(have, indent=1) + "\n")
        added[src.name] = len(fresh)
    return added


if __name__ == "__main__":
    dump = Path(sys.argv[1])
    pin = Path(sys.argv[2]) if len(sys.argv) > 2 else PIN
    for name, n in merge(dump, pin).items():
        print(f"{name}: {n} added")
