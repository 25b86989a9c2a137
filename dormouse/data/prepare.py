"""Files → uint8 shards + manifest.json: the one way a corpus is made.

Inputs are files, folders (walked recursively; regular files only) and `.gz` files (decompressed).
Each file is one *document*, named by its path relative to the input: a file given directly is
named by its base name, a file found under folder `d` is named `d/<relative path>` (POSIX slashes).
Documents are concatenated as raw bytes in sorted name order, with no separator between them: the
corpus is a byte stream, and a separator would be a byte the source never contained.

The held-out split is fixed here, once, by the manifest:

- by document (default): documents are ranked by sha256 of their name and the first
  max(1, round(fraction · n)) are held out. A document never straddles the split, and adding files
  moves no other document across it (their ranks relative to each other do not change).
- tail (`heldout_tail=F`, one document only): nanoGPT's tiny-shakespeare split,
  train = data[:int(n * (1 - F))], held-out = the rest.
- tail with a validation slice (`heldout_tail=F, validation_tail=V`): a corpus for tuning that never
  holds the held-out bytes. Of data[:c], c = int(n * (1 - F)) (the tail split's train part), the first
  int(c * (1 - V)) bytes are its train split and the rest its "heldout" split, a validation slice;
  data[c:] is not written. Tuning reads this corpus; only the final report reads the tail split's.

Layout of `out/`: `train-00000.bin`, … and `heldout-00000.bin`, … (uint8, each at most
`shard_bytes`, never empty) and `manifest.json`: format version, every shard {path, split, size,
sha256}, the held-out rule, every source document {name, size, sha256} (size and hash of the bytes
it contributed, i.e. after decompression), totals per split, and the corpus fingerprint: sha256 over
the lines `"<shard path> <shard sha256>\\n"` in manifest order.

The corpus is written into a temporary sibling of `out`, fsynced, then renamed to `out`: a failure
leaves nothing under the final name, and an existing non-empty `out` is never touched. A failure that
raises removes the temporary folder; one left by a prepare that was killed is removed by the next
prepare of the same `out` on that host.
"""

import contextlib
import gzip
import hashlib
import json
import os
import secrets
import shutil
import socket
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dormouse import run_lock
from dormouse.errors import DataError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "heldout")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Document:
    name: str  # stable, machine-independent name: ranks the document in the held-out split
    path: Path

    @property
    def gzipped(self) -> bool:
        return self.path.suffix == ".gz"


def prepare(
    inputs: list[str | Path],
    out: str | Path,
    *,
    heldout_fraction: float = 0.1,
    heldout_tail: float | None = None,
    validation_tail: float | None = None,
    shard_bytes: int = 256 * 2**20,
) -> dict:
    """Prepare a corpus from files, folders and .gz files; returns the manifest written to `out`."""
    return write_corpus(
        collect_documents(inputs),
        out,
        heldout_fraction=heldout_fraction,
        heldout_tail=heldout_tail,
        validation_tail=validation_tail,
        shard_bytes=shard_bytes,
    )


def collect_documents(inputs: list[str | Path]) -> list[Document]:
    """Every document under `inputs`, sorted by name. Refuses missing, unreadable or odd inputs."""
    if not inputs:
        raise DataError("no inputs given: name at least one file or folder")
    docs: list[Document] = []
    for raw in inputs:
        path = Path(raw)
        mode = _stat(path).st_mode
        if stat.S_ISDIR(mode):
            found = _walk(path)
            if not found:
                raise DataError(f"input folder {path} holds no files: the corpus would be empty")
            docs += found
        elif stat.S_ISREG(mode):
            docs.append(Document(path.name, path))
        else:
            raise DataError(f"input {path} is neither a regular file nor a folder")
    docs.sort(key=lambda d: d.name)
    for a, b in zip(docs, docs[1:], strict=False):
        if a.name == b.name:
            raise DataError(f"two inputs share the document name {a.name!r}: {a.path} and {b.path}")
    return docs


def write_corpus(
    docs: list[Document],
    out: str | Path,
    *,
    heldout_fraction: float = 0.1,
    heldout_tail: float | None = None,
    validation_tail: float | None = None,
    shard_bytes: int = 256 * 2**20,
) -> dict:
    """Write `docs` (in the given order) as a corpus at `out`; see the module docstring."""
    out = Path(out)
    _check_fraction("heldout_fraction", heldout_fraction, out)
    if heldout_tail is not None:
        _check_fraction("heldout_tail", heldout_tail, out)
    if validation_tail is not None:
        if heldout_tail is None:
            raise DataError(
                f"validation_tail carves a validation slice out of a tail split's train part: give "
                f"heldout_tail too (corpus {out})"
            )
        _check_fraction("validation_tail", validation_tail, out)
    if not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise DataError(f"shard_bytes must be a positive integer, got {shard_bytes!r} (corpus {out})")
    if not docs:
        raise DataError(f"no documents to prepare into {out}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out} already exists and is not empty: refusing to overwrite a corpus")

    if heldout_tail is None:
        held = _heldout_documents(docs, heldout_fraction)
        heldout = {"mode": "document", "fraction": heldout_fraction, "documents": sorted(held)}
    else:
        if len(docs) != 1:
            raise DataError(
                f"heldout_tail splits one file, got {len(docs)} documents "
                f"({docs[0].path}, {docs[1].path}, ...): use the held-out fraction by document"
            )
        heldout = {"mode": "tail", "fraction": heldout_tail}
        if validation_tail is not None:  # the held-out split is a validation slice; the tail is left out
            heldout = {"mode": "tail-validation", "fraction": heldout_tail, "validation": validation_tail}

    tmp = out.parent / f"{_tmp_prefix(out)}{os.getpid()}-{secrets.token_hex(4)}"
    writers = {split: _ShardWriter(tmp, split, shard_bytes) for split in SPLITS}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_killed_writes(out)
        tmp.mkdir()
        if heldout["mode"] == "document":
            sources = [_copy(d, writers["heldout" if d.name in held else "train"].write) for d in docs]
        else:
            sources = [_copy_tail(docs[0], heldout_tail, writers, validation_tail)]
        shards = writers["train"].close() + writers["heldout"].close()
        totals = {split: writers[split].total for split in SPLITS}
        _check_totals(totals, docs, heldout)
        manifest = {
            "format": "dormouse-corpus",
            "version": FORMAT_VERSION,
            "shards": shards,
            "heldout": heldout,
            "sources": sources,
            "totals": totals,
            "fingerprint": fingerprint(shards),
        }
        _write_synced(tmp / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
        _fsync_dir(tmp)
        try:
            os.rename(tmp, out)
        except OSError as e:  # `out` appeared, non-empty, while we were writing
            raise DataError(f"cannot create corpus {out}: {e.strerror}; refusing to overwrite it") from e
        _fsync_dir(out.parent)
    except OSError as e:  # disk full, quota, permissions, an input gone: one line, nothing under `out`
        where = f": {e.filename}" if e.filename else ""
        raise DataError(f"preparing {out} failed ({e.strerror or e}{where}); nothing was written under {out}") from e
    finally:
        for w in writers.values():
            with contextlib.suppress(OSError):  # a full disk fails the close's flush too
                w.discard()
        if tmp.exists():
            shutil.rmtree(tmp)
    return manifest


def _tmp_prefix(out: Path) -> str:
    """The temporary folders of `out` written on this host: `.NAME.tmp-HOST-PID-RANDOM`."""
    return f".{out.name}.tmp-{socket.gethostname()}-"


def _remove_killed_writes(out: Path) -> None:
    """Remove the temporary folders of `out` left by a prepare on this host that was killed (its pid has
    ended). One of a running prepare, or of another host, is left alone."""
    prefix = _tmp_prefix(out)
    for entry in out.parent.iterdir():
        pid = entry.name.removeprefix(prefix).split("-")[0]
        if entry.name.startswith(prefix) and pid.isdigit() and run_lock.gone(socket.gethostname(), int(pid)):
            shutil.rmtree(entry)


def fingerprint(shards: list[dict]) -> str:
    """The corpus identity: sha256 over each shard's path and sha256, in manifest order."""
    h = hashlib.sha256()
    for s in shards:
        h.update(f"{s['path']} {s['sha256']}\n".encode())
    return h.hexdigest()


def _heldout_documents(docs: list[Document], fraction: float) -> set[str]:
    if len(docs) == 1:
        raise DataError(
            f"one document ({docs[0].path}) cannot be held out by document without leaving train empty: "
            "use --heldout-tail F to hold out the last fraction F of it"
        )
    k = max(1, round(fraction * len(docs)))
    if k >= len(docs):
        raise DataError(
            f"held-out fraction {fraction} of {len(docs)} documents holds out all of them "
            f"(from {docs[0].path} ...): the train split would be empty"
        )
    ranked = sorted(docs, key=lambda d: hashlib.sha256(d.name.encode()).hexdigest())
    return {d.name for d in ranked[:k]}


def _check_totals(totals: dict[str, int], docs: list[Document], heldout: dict) -> None:
    where = ", ".join(str(d.path) for d in docs[:3]) + (" ..." if len(docs) > 3 else "")
    if totals["train"] + totals["heldout"] == 0:
        raise DataError(f"the corpus is empty: every input holds 0 bytes ({where})")
    if totals["heldout"] == 0:
        names = ", ".join(heldout.get("documents", [])) or str(docs[0].path)
        raise DataError(f"the held-out split would be empty: held-out document(s) {names} hold 0 bytes")
    if totals["train"] == 0:
        raise DataError(f"the train split would be empty: train documents hold 0 bytes ({where})")


def _copy(doc: Document, sink: Callable[[bytes], None]) -> dict:
    """Stream one document into `sink`; returns its source record."""
    h, size = hashlib.sha256(), 0
    for chunk in _chunks(doc):
        h.update(chunk)
        size += len(chunk)
        sink(chunk)
    return {"name": doc.name, "size": size, "sha256": h.hexdigest()}


def _copy_tail(doc: Document, fraction: float, writers: dict, validation: float | None = None) -> dict:
    """nanoGPT's split: the first int(n * (1 - F)) bytes train, the rest held out. With `validation`
    V, only those first bytes are written: their last fraction V as the "heldout" (validation) split."""
    n = sum(len(c) for c in _chunks(doc))  # a .gz has no size before decompression
    end = n if validation is None else int(n * (1 - fraction))
    cut = int(n * (1 - fraction)) if validation is None else int(end * (1 - validation))
    pos = 0

    def sink(chunk: bytes) -> None:
        nonlocal pos
        head = max(0, min(len(chunk), cut - pos))
        kept = max(0, min(len(chunk), end - pos))
        writers["train"].write(chunk[:head])
        writers["heldout"].write(chunk[head:kept])
        pos += len(chunk)

    source = _copy(doc, sink)
    if source["size"] != n:
        raise DataError(f"input {doc.path} changed while it was being prepared ({n} then {source['size']} bytes)")
    return source


def _chunks(doc: Document) -> Iterator[bytes]:
    try:
        with _open_document(doc) as f:
            while chunk := f.read(_CHUNK):
                yield chunk
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"input {doc.path} is not a valid .gz file: {e}") from e
    except OSError as e:
        raise DataError(f"cannot read input {doc.path}: {e.strerror or e}") from e


def _open_document(doc: Document):
    return gzip.open(doc.path, "rb") if doc.gzipped else open(doc.path, "rb")


class _ShardWriter:
    """Writes one split as shards of at most `shard_bytes`; a shard is opened only when bytes arrive."""

    def __init__(self, root: Path, split: str, shard_bytes: int):
        self.root, self.split, self.shard_bytes = root, split, shard_bytes
        self.shards: list[dict] = []
        self.total = 0
        self._file = None
        self._hash = None
        self._size = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._file is None:
                self._open()
            take = view[: self.shard_bytes - self._size]
            self._file.write(take)
            self._hash.update(take)
            self._size += len(take)
            self.total += len(take)
            view = view[len(take) :]
            if self._size == self.shard_bytes:
                self._finish()

    def close(self) -> list[dict]:
        if self._file is not None:
            self._finish()
        return self.shards

    def discard(self) -> None:
        """Close a shard left open by a failure (its directory is about to be removed)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self._file = open(self.root / name, "wb")
        self._hash, self._size = hashlib.sha256(), 0
        self.shards.append({"path": name, "split": self.split})

    def _finish(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.shards[-1].update(size=self._size, sha256=self._hash.hexdigest())
        self._file = None


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except FileNotFoundError as e:
        raise DataError(f"input {path} does not exist") from e
    except OSError as e:
        raise DataError(f"cannot stat input {path}: {e.strerror}") from e


def _walk(root: Path) -> list[Document]:
    name = root.resolve().name  # `.` or `data/` name their folder, not an empty string
    return [Document(f"{name}/{p.relative_to(root).as_posix()}", p) for p in walk_files(root)]


def walk_files(root: Path, skip_folders: frozenset[str] = frozenset()) -> Iterator[Path]:
    """Regular files under `root`, recursively, minus folders named in `skip_folders`.

    Symlinked folders are not followed (no cycles); an unreadable folder is refused, not skipped.
    """

    def refuse(e: OSError) -> None:
        raise DataError(f"cannot read input folder {e.filename}: {e.strerror}") from e

    for folder, dirs, files in os.walk(root, onerror=refuse):
        dirs[:] = [d for d in dirs if d not in skip_folders]
        for f in files:
            path = Path(folder, f)
            if stat.S_ISREG(_stat(path).st_mode):
                yield path


def _check_fraction(name: str, value: float, out: Path) -> None:
    if not isinstance(value, int | float) or not 0 < value < 1:
        raise DataError(f"{name} must be in (0, 1), got {value!r} (corpus {out})")


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
