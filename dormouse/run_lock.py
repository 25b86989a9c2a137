"""One writer per run directory: `RUN/.lock`, held with flock for as long as a command writes the run.

The lock file names its holder (host, pid, command). A second writer is refused naming the holder. A
holder that ends normally removes the file; one killed (kill -9, out of memory, power loss) leaves it
behind with the flock released. The next writer reports such a stale lock, with the command that
removes it, and stops: a lock is never taken over silently, since on a shared filesystem the holder
may be alive on another host whose flock this host cannot see.
"""

import contextlib
import errno
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from dormouse.errors import DormouseError

LOCK = ".lock"


class RunLockedError(DormouseError):
    """The run directory is held by another writer, or by one that died holding it."""


@contextlib.contextmanager
def held(run: str | os.PathLike, command: str) -> Iterator[Path]:
    """Hold `run`'s lock for the block (the directory must exist); yields the lock file's path."""
    path = Path(run) / LOCK
    fd = _acquire(path, command)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # removed while still held: no other writer can take it between the two
        os.close(fd)


def held_for(path: str | os.PathLike | None, command: str) -> contextlib.AbstractContextManager:
    """Hold, for the block, the lock of the run directory that file `path` is written into (a history TSV
    given by `--history`); nothing when `path` is None or its folder is not a run directory (no config.json)."""
    folder = None if path is None else Path(path).resolve().parent
    if folder is None or not (folder / "config.json").is_file():
        return contextlib.nullcontext()
    return held(folder, command)


def _acquire(path: Path, command: str) -> int:
    me = {"host": socket.gethostname(), "pid": os.getpid(), "command": command}
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunLockedError(
                f"cannot create the lock {path}: {e.strerror}; the run directory must be writable"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunLockedError(f"cannot lock {path}: {e.strerror}") from e
            raise RunLockedError(
                f"{path.parent} is being written by {_describe(holder)}: one writer per run directory; "
                "wait for it to finish or stop it"
            ) from None
        if not _same_file(fd, path):  # the holder removed it between our open and flock: try the new one
            os.close(fd)
            continue
        holder = _read(fd)
        if holder:
            os.close(fd)
            raise RunLockedError(
                f"stale lock {path}: left by {_describe(holder)}, which {_fate(holder)}; "
                f"if no process writes {path.parent}, remove it (rm {path}) and run again"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _read(fd: int) -> dict | None:
    """The holder recorded in the lock file; None when empty (a writer stopped between create and write)."""
    raw = os.pread(fd, 4096, 0)
    if not raw.strip():
        return None
    try:
        holder = json.loads(raw)
    except ValueError:
        return {"unreadable": raw[:80].decode(errors="replace")}
    return holder if isinstance(holder, dict) else {"unreadable": str(holder)[:80]}


def _describe(holder: dict | None) -> str:
    if not holder:
        return "another process (it has not written its name yet)"
    if "unreadable" in holder:
        return f"an unknown holder ({holder['unreadable']!r})"
    return f"`dormouse {holder.get('command')}` (pid {holder.get('pid')} on host {holder.get('host')})"


def _fate(holder: dict) -> str:
    """Whether the recorded holder is known to be dead: only a pid on this host can be checked."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return "ran on another host: it may still run there (flock is not shared across hosts) or was stopped"
    if gone(holder["host"], holder["pid"]):
        return "is no longer running: it was stopped without releasing it (killed?)"
    return "holds no flock on it (its pid is in use again, or this filesystem has no flock)"


def gone(host: str, pid: int) -> bool:
    """Whether process `pid` of `host` is known to have ended: only a pid of this host can be checked."""
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False
