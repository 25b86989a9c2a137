"""Loading a prepared corpus: every shard stat'ed, size-checked and hash-verified, then memmapped.

A shard that could not be stat'ed, counted as 0 bytes, would shrink the corpus silently. So a shard
that cannot be stat'ed, is empty, has another size than the manifest says, or fails its sha256 is a
LOUD ledger site: the load stops and names the shard.
Verification is not optional; hashing runs at disk speed (a 30 MB corpus takes a few tens of ms).
"""

import hashlib
import json
import os
from bisect import bisect_right
from pathlib import Path

import numpy as np

from dormouse import ledger
from dormouse.data.prepare import FORMAT_VERSION, MANIFEST, SPLITS, fingerprint
from dormouse.errors import DataError

UNSTATABLE = ledger.register(
    "data.shard_unstatable",
    ledger.Kind.LOUD,
    "a shard that cannot be stat'ed is refused (counted as 0 bytes, it would shrink the corpus silently)",
    __name__,
)
EMPTY = ledger.register(
    "data.shard_empty", ledger.Kind.LOUD, "a zero-byte shard is refused, never counted as 0 bytes", __name__
)
SIZE_MISMATCH = ledger.register(
    "data.shard_size_mismatch",
    ledger.Kind.LOUD,
    "a shard whose size differs from the manifest is refused, not read short or long",
    __name__,
)
HASH_MISMATCH = ledger.register(
    "data.shard_hash_mismatch",
    ledger.Kind.LOUD,
    "a shard whose sha256 differs from the manifest is refused, not trained on",
    __name__,
)


class Corpus:
    """A verified corpus. Each split reads as one virtual concatenation of its shards."""

    def __init__(self, root: Path, manifest: dict, shards: dict[str, list[np.ndarray]]):
        self.root = root
        self.manifest = manifest
        self.fingerprint: str = manifest["fingerprint"]
        self._shards = shards
        # _starts[split][i] is the offset of shard i within its split
        self._starts = {s: np.cumsum([0] + [len(a) for a in arrs]).tolist() for s, arrs in shards.items()}

    def split_size(self, split: str) -> int:
        return self._split_starts(split)[-1]

    def read(self, split: str, offset: int, length: int) -> np.ndarray:
        """Bytes [offset, offset + length) of `split` as uint8, exactly `length` of them or it raises.

        Within one shard this is a read-only view of the memmap; across shards, a copy.
        """
        starts = self._split_starts(split)
        if offset < 0 or length < 0 or offset + length > starts[-1]:
            raise DataError(
                f"read of {length} bytes at offset {offset} is outside the {split} split "
                f"({starts[-1]} bytes) of corpus {self.root}"
            )
        i = bisect_right(starts, offset) - 1
        parts, end = [], offset + length
        while offset < end:  # a window may straddle shards: take each shard's part in turn
            lo, hi = offset - starts[i], min(end, starts[i + 1]) - starts[i]
            parts.append(self._shards[split][i][lo:hi])
            offset += hi - lo
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate([np.empty(0, np.uint8), *parts])

    def _split_starts(self, split: str) -> list[int]:
        if split not in self._starts:
            raise DataError(f"unknown split {split!r}: expected one of {list(SPLITS)}")
        return self._starts[split]


def load_corpus(root: str | Path) -> Corpus:
    """Read manifest.json, verify every shard (stat, size, sha256) and memmap it."""
    root = Path(root)
    manifest = _read_manifest(root)
    shards: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for entry in manifest["shards"]:
        shards[entry["split"]].append(_verified_shard(root, entry))
    for split in SPLITS:
        have = sum(len(a) for a in shards[split])
        if have != manifest["totals"].get(split):
            raise DataError(
                f"manifest {root / MANIFEST} is inconsistent: {split} shards hold {have} bytes, "
                f"totals say {manifest['totals'].get(split)}"
            )
    if fingerprint(manifest["shards"]) != manifest["fingerprint"]:
        raise DataError(f"manifest {root / MANIFEST} is inconsistent: its fingerprint does not match its shards")
    return Corpus(root, manifest, shards)


def inspect_corpus(root: str | Path) -> str:
    """A `key: value` summary of a corpus (loading it verifies every shard)."""
    c = load_corpus(root)
    held = c.manifest["heldout"]
    lines = [
        f"corpus: {c.root}",
        f"train bytes: {c.split_size('train')}",
        f"heldout bytes: {c.split_size('heldout')}",
        f"shards: {len(c.manifest['shards'])}",
        f"heldout mode: {held['mode']}",
        f"heldout fraction: {held['fraction']}",
    ]
    if held["mode"] == "document":
        lines.append(f"heldout documents: {len(held['documents'])}")
    if held["mode"] == "tail-validation":
        lines.append(f"validation fraction: {held['validation']} (the held-out split is a validation slice)")
    lines += [f"sources: {len(c.manifest['sources'])}", f"fingerprint: {c.fingerprint}"]
    return "\n".join(lines)


def _read_manifest(root: Path) -> dict:
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise DataError(f"{root} is not a prepared corpus: {path} does not exist") from e
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != "dormouse-corpus":
        raise DataError(f"{path} is not a dormouse corpus manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise DataError(f"{path} has format version {manifest.get('version')!r}; this dormouse reads {FORMAT_VERSION}")
    missing = {"shards", "heldout", "sources", "totals", "fingerprint"} - manifest.keys()
    if missing:
        raise DataError(f"{path} lacks the field(s) {sorted(missing)}")
    if not isinstance(manifest["shards"], list):
        raise DataError(f"{path}: shards is a {type(manifest['shards']).__name__}, expected a list of entries")
    for entry in manifest["shards"]:
        if (
            not isinstance(entry, dict)
            or entry.keys() != {"path", "split", "size", "sha256"}
            or entry["split"] not in SPLITS
            or not isinstance(entry["path"], str)
            or Path(entry["path"]).name != entry["path"]  # a shard lives in the corpus folder itself
            or not _is_count(entry["size"])
            or not isinstance(entry["sha256"], str)
        ):
            raise DataError(f"{path} lists a bad shard entry {entry}")
    totals = manifest["totals"]
    if not isinstance(totals, dict) or not all(_is_count(totals.get(split)) for split in SPLITS):
        raise DataError(f"{path}: totals is {totals!r}, expected a byte count for each of {list(SPLITS)}")
    held, sources = manifest["heldout"], manifest["sources"]
    if not isinstance(held, dict) or held.get("mode") not in ("document", "tail", "tail-validation"):
        raise DataError(f"{path}: heldout is {held!r}, expected the held-out rule written by `dormouse prepare`")
    if not isinstance(sources, list):
        raise DataError(f"{path}: sources is a {type(sources).__name__}, expected a list of documents")
    if not isinstance(manifest["fingerprint"], str):
        raise DataError(f"{path}: fingerprint is {manifest['fingerprint']!r}, expected a sha256 string")
    return manifest


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _verified_shard(root: Path, entry: dict) -> np.ndarray:
    path = root / entry["path"]
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise ledger.refuse(UNSTATABLE, f"shard {path} cannot be stat'ed ({e.strerror}); it is not 0 bytes") from e
    if size == 0:
        raise ledger.refuse(EMPTY, f"shard {path} is empty (the manifest says {entry['size']} bytes)")
    if size != entry["size"]:
        raise ledger.refuse(SIZE_MISMATCH, f"shard {path} is {size} bytes, the manifest says {entry['size']}")
    try:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as e:
        raise DataError(f"cannot read shard {path}: {e.strerror}") from e
    if digest != entry["sha256"]:
        raise ledger.refuse(HASH_MISMATCH, f"shard {path} has sha256 {digest}, the manifest says {entry['sha256']}")
    return np.memmap(path, dtype=np.uint8, mode="r")
