"""Which code a measurement ran: the checkout's commit and a fingerprint of the package's sources."""

import hashlib
import os
import subprocess
from pathlib import Path

import dormouse

PACKAGE = Path(dormouse.__file__).resolve().parent


def repo_root() -> Path:
    """The folder that holds the dormouse package: the checkout's root when run from a clone."""
    return PACKAGE.parent


def git_commit(root: Path) -> str:
    """`git rev-parse --short HEAD`, plus -dirty when the tree has uncommitted changes (untracked files too).

    DORMOUSE_COMMIT, when set, is taken as is: the device tool copies the working tree but not its git
    history, so there the checkout's HEAD is not the tree's (benches/gpu_call.sh sets it from the
    `.device-commit` file written beside the tree before the call)."""
    if os.environ.get("DORMOUSE_COMMIT"):
        return os.environ["DORMOUSE_COMMIT"]

    def git(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True, check=False)

    try:
        head = git("rev-parse", "--short", "HEAD")
    except FileNotFoundError:
        return "unknown(no git)"
    if head.returncode != 0:
        return "unknown(not a git checkout)"
    dirty = git("status", "--porcelain").stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def code_fingerprint() -> str:
    """sha256 (12 hex) of the dormouse package's sources and committed kernel pin: what computes a run.

    Two runs with one fingerprint ran the same code whatever the commit says (a commit that only adds
    logs or docs keeps it; a kernel pin entry merged in changes it), so `dormouse ab` compares this, not
    the commit, before reusing or merging runs made in other jobs or checkouts."""
    package = PACKAGE
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".json") and p.is_file()):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]
