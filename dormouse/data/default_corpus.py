"""The embedded default corpus: the running interpreter's standard-library sources.

Every `*.py` under `sysconfig.get_paths()["stdlib"]` (site-packages and dist-packages excluded: they
differ between machines with the same Python), each named by its path relative to the stdlib
folder, held out by document (10 %). It is prepared once and cached under
`$XDG_CACHE_HOME/dormouse/default-corpus/<key>/` (default `~/.cache`), where the key is the Python
version plus a hash of the file list (names, sizes, mtimes). The manifest holds the real sha256s
and every load verifies them.

Preparing takes a few seconds (longer on a cold disk): it reports on stderr when it starts, how many
of the sources' bytes are written every `PROGRESS_EVERY` seconds, and when it is done.

Two processes may prepare at once: each writes to its own temporary name and renames it to the
key folder; the loser of the rename removes its copy and uses the winner's.
"""

import contextlib
import errno
import hashlib
import os
import platform
import secrets
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from dormouse.data.prepare import FORMAT_VERSION, Document, walk_files, write_corpus
from dormouse.data.shards import load_corpus

HELDOUT_FRACTION = 0.1
_EXCLUDED = frozenset({"site-packages", "dist-packages"})
PROGRESS_EVERY = 1.0  # seconds between progress lines while the corpus is prepared


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def default_corpus_dir() -> Path:
    """The cached default corpus, prepared on first use; verified before it is returned."""
    docs = _documents(stdlib_dir())
    final = _cache_root() / _key(docs)
    if not final.exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        mine = final.parent / f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}"
        with _progress(docs, final, mine):
            write_corpus(docs, mine, heldout_fraction=HELDOUT_FRACTION)
        try:
            os.rename(mine, final)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            shutil.rmtree(mine)  # another process won the race; its corpus is the same one
    load_corpus(final)
    return final


def describe_default_corpus() -> str:
    """One line for the run header."""
    corpus = load_corpus(default_corpus_dir())
    return (
        f"default corpus: Python {platform.python_version()} stdlib sources, "
        f"{len(corpus.manifest['sources'])} files, {corpus.split_size('train')} bytes train / "
        f"{corpus.split_size('heldout')} bytes held-out, fingerprint {corpus.fingerprint[:12]}"
    )


def _documents(root: Path) -> list[Document]:
    paths = [p for p in walk_files(root, skip_folders=_EXCLUDED) if p.suffix == ".py"]
    return sorted((Document(p.relative_to(root).as_posix(), p) for p in paths), key=lambda d: d.name)


def _key(docs: list[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        st = d.path.stat()
        h.update(f"{d.name}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    return f"py{platform.python_version()}-v{FORMAT_VERSION}-{h.hexdigest()[:16]}"


@contextlib.contextmanager
def _progress(docs: list[Document], final: Path, mine: Path) -> Iterator[None]:
    """Progress lines on stderr while `docs` are written to `mine` (and its temporary siblings)."""
    total = sum(d.path.stat().st_size for d in docs)
    start = time.monotonic()
    print(f"default corpus: preparing {len(docs)} stdlib files ({_mib(total)}) once, into {final}", file=sys.stderr)
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_EVERY):
            written = min(_bytes_under(final.parent, f".{mine.name}"), total)
            elapsed = time.monotonic() - start
            print(f"default corpus: {_mib(written)} of {_mib(total)} written ({elapsed:.0f} s)", file=sys.stderr)

    reporter = threading.Thread(target=report, name="default-corpus-progress", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()
    print(f"default corpus: prepared in {time.monotonic() - start:.1f} s", file=sys.stderr)


def _bytes_under(folder: Path, prefix: str) -> int:
    """Bytes of the files under `folder`'s entries whose names start with `prefix`; files that vanish
    while counted (the rename at the end) count as nothing."""
    n = 0
    for entry in folder.glob(f"{prefix}*"):
        for path in entry.rglob("*") if entry.is_dir() else [entry]:
            with contextlib.suppress(OSError):
                n += path.stat().st_size if path.is_file() else 0
    return n


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dormouse" / "default-corpus"
