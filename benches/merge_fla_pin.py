"""Merge fla kernel choices dumped on the device (DORMOUSE_FLA_DUMP, fla's file format) into a card's pin.

    python benches/merge_fla_pin.py [--replace] <dump dir> dormouse/ops/fla/configs/<card>

A new card's pin starts as `dormouse tune --into <empty dir>` on that card (every kernel timed there);
merged into dormouse/ops/fla/configs/<card>/, with the card's compute capability in pin.PIN_CAPABILITY.

Entries already pinned are kept as they are, in their order (the pin is never re-decided). A dumped
choice is added only where the pin did not make it: its key has no entry, and the entry fla's fuzzy
lookup would take for it (the first whose key differs from it in numbers only) is missing or holds
another config (the kernel refused it and Triton timed a new one). A choice the pin made by a fuzzy
match is not added again: the code (and `dormouse ab`'s code fingerprint) stays the same when the
kernels are. New entries go at the end, so no earlier entry loses a fuzzy match to them. Prints the
count added per kernel file.

`--replace` re-decides instead, for choices timed against the pin's own (benches/fla_config_probe.py
writes them under <out>/choices): each dumped config takes the place of the entry fla's lookup would
take for its key (exact, else the first fuzzy match), where it stands; a key with no such entry is
appended. Prints the count replaced or added per kernel file.
"""

import json
import sys
from pathlib import Path

from dormouse.ops.fla.pin import UNPINNED_FILE, key_class, same_config


def pinned_config(entries: dict, key: str, autotune_key: list) -> dict | None:
    """The config fla's lookup (exact, then the first fuzzy match) takes from `entries`, or None."""
    if key in entries:
        return entries[key]["config"]
    wanted = key_class(autotune_key)  # fla's fuzzy match: numbers match any number, the rest must be equal
    return next((e["config"] for e in entries.values() if key_class(e["autotune_key"]) == wanted), None)


def _pairs(dump: Path, pin: Path):
    """(kernel file name, its path in the pin, the dumped file, the pin's file or an empty one) per dumped file."""
    for src in sorted(p for p in dump.glob("*.json") if p.name != UNPINNED_FILE):
        target = pin / src.name
        new = json.loads(src.read_text())
        have = json.loads(target.read_text()) if target.exists() else {**new, "autotune_entries": {}}
        yield src.name, target, new, have


def merge(dump: Path, pin: Path) -> dict[str, int]:
    added = {}
    for name, target, new, have in _pairs(dump, pin):
        entries = have["autotune_entries"]
        fresh = {}
        for key, entry in new["autotune_entries"].items():
            if key in entries:
                continue
            pinned = pinned_config(entries, key, entry["autotune_key"])
            if pinned is None or not same_config(pinned, entry["config"]):
                fresh[key] = entry
        if fresh:
            have["autotune_entries"] = {**entries, **fresh}
            target.write_text(json.dumps(have, indent=1) + "\n")
        added[name] = len(fresh)
    return added


def replace(dump: Path, pin: Path) -> dict[str, int]:
    changed = {}
    for name, target, new, have in _pairs(dump, pin):
        entries = have["autotune_entries"]
        for key, entry in new["autotune_entries"].items():
            fuzzy = (k for k, e in entries.items() if key_class(e["autotune_key"]) == key_class(entry["autotune_key"]))
            taken = key if key in entries else next(fuzzy, key)
            entries[taken] = {**entries.get(taken, entry), "config": entry["config"]}
        target.write_text(json.dumps(have, indent=1) + "\n")
        changed[name] = len(new["autotune_entries"])
    return changed


if __name__ == "__main__":
    args = sys.argv[1:]
    re_decide = args[:1] == ["--replace"]
    args = args[1:] if re_decide else args
    if len(args) != 2:
        sys.exit("usage: python benches/merge_fla_pin.py [--replace] <dump dir> dormouse/ops/fla/configs/<card>")
    dump, pin = Path(args[0]), Path(args[1])
    pin.mkdir(exist_ok=True)
    for name, n in (replace if re_decide else merge)(dump, pin).items():
        print(f"{name}: {n} {'replaced or added' if re_decide else 'added'}")
