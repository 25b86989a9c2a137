"""Write a variant of the fla kernel pin with some kernels' warps changed, for an A/B arm on the device
(`FLA_CONFIG_DIR=<out> FLA_CACHE_MODE=fuzzy dormouse bench ...`).

    python benches/pin_variant.py OUT KERNEL=WARPS [KERNEL=WARPS ...] [--pin DIR]

OUT gets a copy of the pin (dormouse/model/fla_configs/NVIDIA_H200 by default) in which every entry of
each named kernel takes WARPS warps, its other choices (block sizes, stages) kept. A config fla's own
list does not offer is still a valid Triton launch: session 23's lead is fla's wy_dqkg backward with 8
warps, where Hopper gets 2 or 4 (docs/performance.md). Nothing in the repo changes.
"""

import argparse
import json
import shutil
from pathlib import Path

PIN = Path(__file__).resolve().parents[1] / "dormouse/model/fla_configs/NVIDIA_H200"


def write_variant(out: Path, warps: dict[str, int], pin: Path = PIN) -> dict[str, int]:
    """Copy `pin` to `out` with each kernel of `warps` at that many warps; returns {kernel: entries changed}."""
    missing = [name for name in warps if not (pin / f"{name}.json").is_file()]
    if missing:
        raise SystemExit(f"no such kernel in {pin}: {', '.join(missing)}")
    shutil.copytree(pin, out, dirs_exist_ok=True)
    changed = {}
    for name, n in warps.items():
        path = out / f"{name}.json"
        table = json.loads(path.read_text())
        for entry in table["autotune_entries"].values():
            entry["config"]["num_warps"] = n
        path.write_text(json.dumps(table, indent=1) + "\n")
        changed[name] = len(table["autotune_entries"])
    return changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("warps", nargs="+", help="KERNEL=WARPS")
    ap.add_argument("--pin", type=Path, default=PIN)
    args = ap.parse_args()
    pairs = [item.split("=") for item in args.warps]
    if any(len(p) != 2 or not p[1].isdigit() for p in pairs):
        ap.error("each change is KERNEL=WARPS, WARPS a number")
    for name, count in write_variant(args.out, {k: int(v) for k, v in pairs}, args.pin).items():
        print(f"{name}: {count} entries at the new warps, in {args.out}")


if __name__ == "__main__":
    main()
