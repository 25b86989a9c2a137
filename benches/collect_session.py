"""Bring one device call's results into the repo: history rows, logs, kernel choices, compiled kernels.

    python benches/collect_session.py <the call's files_at folder> benches/logs/<date>-h200-session<N>

The folder holds results.tgz (extracted here into a temporary folder) and any tc.tgz.part_* beside it;
a folder where results.tgz was already extracted is taken as it is.

What `benches/gpu_session.sh` packed (history.tsv, bench-logs/, fla-pin/, the commands' own files):
- rows of its history.tsv that benches/history.tsv lacks are appended; a row whose log names an A/B's
  device path (/tmp/<name>/ab.json, or /tmp/<name>/b<i>/ab.json of several --b) is pointed at the copy
  this script commits, <log dir>/<name>.json (<name>-b<i>.json),
  which must have come back (the session scripts copy /tmp/<name>/ab.json to $OUT/<name>.json); a
  recorded run's /tmp/<name>/metrics.jsonl likewise at <log dir>/<name>.metrics.jsonl;
- bench logs the repo lacks are copied into benches/logs/ (a row that names one by an absolute device
  path, a bench run from another tree, is pointed at it);
- the commands' *.json, *.jsonl and *.png go into the log dir as they are, their *.log without progress
  bars (tqdm's carriage-return redraws, which are most of a training log's bytes);
- fla's kernel choices are merged into the pin (merge_fla_pin.py);
- tc.tgz.part_* (TRITON_CACHE_BACK) replace .triton-cache/'s parts, for the next call to carry.
Prints what it did.
"""

import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from merge_fla_pin import PIN, merge  # noqa: E402

from dormouse.tools.bench import _shown_path  # noqa: E402  (how bench and ab name a log in a row)

ROOT = Path(__file__).resolve().parents[1]
# A row's log on the device -> the name the session scripts copy it to under $OUT (and this script into the
# log dir): an A/B's /tmp/<name>/ab.json -> <name>.json, one of several --b's /tmp/<name>/b<i>/ab.json ->
# <name>-b<i>.json (benches/sessions/ab-rows.sh), a recorded run's /tmp/<name>/metrics.jsonl ->
# <name>.metrics.jsonl (`dormouse train --record`).
# A bench run from another tree (a session's .base-tree/<commit>, writing into the repo's benches/logs/)
# names its log by its absolute device path: the same file, committed as benches/logs/<name>.
OUTSIDE_TREE_LOG = re.compile(r"^/.*/benches/logs/([\w.-]+\.log)$")
DEVICE_LOGS = (
    (re.compile(r"^/tmp/([\w.-]+)/ab\.json$"), "{}.json"),
    (re.compile(r"^/tmp/([\w.-]+)/(b\d+)/ab\.json$"), "{}-{}.json"),
    (re.compile(r"^/tmp/([\w.-]+)/metrics\.jsonl$"), "{}.metrics.jsonl"),
)


def strip_progress(text: str) -> str:
    """A log read in text mode (universal newlines make each of tqdm's carriage-return redraws a line of
    its own) without its progress-bar lines and blank lines."""
    return "\n".join(line for line in text.splitlines() if line.strip() and "%|" not in line) + "\n"


def new_rows(results: Path, history: Path, log_dir: Path) -> list[str]:
    """Rows of the call's history the repo's lacks, their device A/B paths pointed at `log_dir`."""
    ours = history.read_text().splitlines()
    theirs = (results / "history.tsv").read_text().splitlines()
    if theirs[0] != ours[0]:
        raise SystemExit(f"{results / 'history.tsv'}: its header is not {history}'s")
    log_col = ours[0].split("\t").index("log")

    def identity(line: str) -> tuple[str, ...]:  # every cell but the log, which this script rewrites
        cells = line.split("\t")
        return (*cells[:log_col], *cells[log_col + 1 :])

    have = {identity(row) for row in ours}
    rows = []
    for row in theirs[1:]:
        if identity(row) in have:
            continue
        cells = row.split("\t")
        outside = OUTSIDE_TREE_LOG.match(cells[log_col])
        if outside and (results / "bench-logs" / outside.group(1)).exists():
            cells[log_col] = f"benches/logs/{outside.group(1)}"
        for pattern, name in DEVICE_LOGS:
            match = pattern.match(cells[log_col])
            if match:
                copy = log_dir / name.format(*match.groups())
                if not (results / copy.name).exists():
                    raise SystemExit(f"a row names {cells[log_col]}, but {copy.name} did not come back in {results}")
                cells[log_col] = _shown_path(copy)
        rows.append("\t".join(cells))
    return rows


def collect(results: Path, log_dir: Path, history: Path, logs: Path, pin: Path, triton_cache: Path) -> list[str]:
    done = []
    rows = new_rows(results, history, log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted(results.iterdir()):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".png", ".md", ".txt"):
            shutil.copy(path, log_dir / path.name)
            done.append(f"copied {path.name}")
        elif path.is_file() and path.suffix == ".log":
            (log_dir / path.name).write_text(strip_progress(path.read_text(errors="replace")))
            done.append(f"copied {path.name} (progress bars dropped)")
    with history.open("a") as f:
        f.writelines(row + "\n" for row in rows)
    done.append(f"appended {len(rows)} row(s) to {history.name}")
    bench_logs = results / "bench-logs"
    if bench_logs.is_dir():
        for src in sorted(p for p in bench_logs.rglob("*") if p.is_file()):
            target = logs / src.relative_to(bench_logs)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, target)
                done.append(f"bench log {target.relative_to(logs)}")
    if (results / "fla-pin").is_dir():
        added = sum(merge(results / "fla-pin", pin).values())
        done.append(f"{added} kernel choice(s) added to the pin")
    parts = sorted(results.glob("tc.tgz.part_*"))
    if parts:
        triton_cache.mkdir(exist_ok=True)
        for old in triton_cache.glob("tc.tgz.part_*"):
            old.unlink()
        for part in parts:
            shutil.copy(part, triton_cache / part.name)
        done.append(f"{len(parts)} Triton cache part(s) into {triton_cache}")
    return done


def unpack(fetched: Path, into: Path) -> Path:
    """The call's results as one folder: `fetched` itself when results.tgz was already extracted there,
    else `into`, holding results.tgz's contents and the tc.tgz parts that came back beside it."""
    if not (fetched / "results.tgz").exists():
        return fetched
    with tarfile.open(fetched / "results.tgz") as tar:
        tar.extractall(into, filter="data")
    for part in fetched.glob("tc.tgz.part_*"):
        shutil.copy(part, into / part.name)
    return into


def main(fetched: Path, log_dir: Path) -> None:
    history, logs = ROOT / "benches/history.tsv", ROOT / "benches/logs"
    with tempfile.TemporaryDirectory() as tmp:
        results = unpack(fetched, Path(tmp))
        for line in collect(results, log_dir, history, logs, PIN, ROOT / ".triton-cache"):
            print(line)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[2].strip())
    main(Path(sys.argv[1]), Path(sys.argv[2]))
