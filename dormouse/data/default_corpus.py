"""The embedded default corpus: the running interpreter's standard-library sources.

Every `*.py` under `sysconfig.get_paths()["stdlib"]` (site-packages and dist-packages excluded: they
differ between machines with the same Python), each named by its path relative to the stdlib
folder, held out by document (10 %). It is prepared once and cached under
`$XDG_CACHE_HOME/dormouse/default-corpus/<key>/` (default `~/.cache`), where the key is the Python
version plus a hash of the file list (names, sizes, mtimes). The manifest holds the real sha256s
and every load verifies them.

Two processes may prepare at once: each writes to its own temporary name and renames it to the
key folder; the loser of the rename removes its copy and uses the winner's.
"""

import errno
import hashlib
import os
import platform
import secrets
import shutil
import sysconfig
from pathlib import Path

from dormouse.data.prepare import FORMAT_VERSION, Document, walk_files, write_corpus
from dormouse.data.shards import load_corpus

HELDOUT_FRACTION = 0.1
_EXCLUDED = frozenset({"site-packages", "dist-packages"})


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def default_corpus_dir() -> Path:
    """The cached default corpus, prepared on first use; verified before it is returned."""
    docs = _documents(stdlib_dir())
    final = _cache_root() / _key(docs)
    if not final.exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        mine = final.parent / f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}"
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


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dormouse" / "default-corpus"
